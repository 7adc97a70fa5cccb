"""The coordinator's seat in etcd: the client, the membership store and the election."""
