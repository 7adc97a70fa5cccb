"""Short node names (tui/names.py): pure functions."""

from __future__ import annotations

import random

import pytest

from tui.names import ELLIPSIS, common_domain, short_names

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

HOSTS = ["gpu-node-017.example.internal", "gpu-node-018.example.internal", "gpu-node-117.example.internal"]


def distinct(names: dict[str, str]) -> bool:
    return len(set(names.values())) == len(names)


def test_ids_that_fit_stay_whole() -> None:
    assert short_names(HOSTS, 40) == {h: h for h in HOSTS}
    assert short_names(["a", "b"], 1) == {"a": "a", "b": "b"}


def test_the_common_domain_goes_first() -> None:
    assert common_domain(HOSTS) == ".example.internal"
    assert list(short_names(HOSTS, 20).values()) == ["gpu-node-017…", "gpu-node-018…", "gpu-node-117…"]


def test_a_common_prefix_is_elided_and_the_differing_tail_kept() -> None:
    names = short_names(HOSTS, 8)
    assert list(names.values()) == ["gp…-017…", "gp…-018…", "gp…-117…"]
    assert all(len(n) <= 8 for n in names.values())
    ids = [f"rack-{r}-node-{n}" for r in "ab" for n in range(3)]  # two places differ: wider, never alike
    cut = short_names(ids, 8)
    assert distinct(cut) and all(cut[i].endswith(i[-8:]) for i in ids), cut


def test_a_common_suffix_inside_names_keeps_the_differing_start() -> None:
    names = short_names(["rack1-node-a-worker", "rack2-node-a-worker"], 8)
    assert names == {"rack1-node-a-worker": "rack1…er", "rack2-node-a-worker": "rack2…er"}


def test_a_single_node_keeps_its_host_name() -> None:
    assert short_names(["gpu-node-017.us-east-1.compute.internal"], 14) == {
        "gpu-node-017.us-east-1.compute.internal": "gpu-node-017…"}
    assert short_names(["gpu-node-017.us-east-1.compute.internal"], 4)["gpu-node-017.us-east-1.compute.internal"] \
        .startswith("gpu")


@pytest.mark.parametrize("width", [0, 1, 2, 3, 4])
def test_very_narrow_widths_grow_rather_than_collide(width: int) -> None:
    ids = [f"n{i:03d}.cluster.local" for i in range(256)]
    names = short_names(ids, width)
    assert distinct(names) and all(name.strip(ELLIPSIS) for name in names.values())
    assert max(map(len, names.values())) <= 5  # `n017…`: no wider than it must be
    assert distinct(short_names(HOSTS, width))


def test_names_never_collide_on_random_clusters() -> None:
    rng = random.Random(7)
    alphabet = "ab-.0123456789"
    for _ in range(300):
        ids = list({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))).strip(".") or "x"
                    for _ in range(rng.randint(1, 12))})
        width = rng.randint(0, 32)
        names = short_names(ids, width)
        assert set(names) == set(ids) and distinct(names), (ids, width, names)
        assert all(len(names[i]) <= len(i) for i in ids)  # a cut name is never longer than its id
