"""What can go wrong with etcd, by what a daemon does about it: wait it out, change a setting, or stop."""


class EtcdUnavailable(Exception):
    """No endpoint answered; the message names them and the last error."""


class EtcdRefused(EtcdUnavailable):
    """etcd, or the TLS handshake with it, said no: the message says why and which setting to change. At start-up
    a start error; later (a certificate expired, a role revoked) an outage with that reason, bounded like any."""


class EtcdClusterChanged(Exception):
    """An endpoint answered for another etcd cluster than the one this daemon started on."""
