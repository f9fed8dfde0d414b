"""NCCLSettings validation: bad values named with what is accepted, valid settings and their warnings."""

from __future__ import annotations

import pytest

from lit_compute import NCCLSettings


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"algo": "Trie"}, r"NCCL_ALGO='Trie' has unknown token.*ring, tree"),
        ({"algo": "allreduce:tree;gather:ring"}, r"unknown collective 'gather'"),
        ({"proto": "^LL,Fast"}, r"NCCL_PROTO='\^LL,Fast'.*ll, ll128, simple"),
        ({"socket_nthreads": 17}, r"NCCL_SOCKET_NTHREADS=17 is out of range; accepted: 1..16"),
        ({"socket_nthreads": 8, "nsocks_perthread": 16}, r"8 x NCCL_NSOCKS_PERTHREAD=16 = 128 exceeds 64"),
        ({"p2p_level": "NVLINK"}, r"NCCL_P2P_LEVEL='NVLINK'.*LOC, NVL, PIX"),
        ({"min_ctas": 8, "max_ctas": 4}, r"NCCL_MIN_CTAS=8 is above NCCL_MAX_CTAS=4"),
        ({"buffsize": -1}, r"NCCL_BUFFSIZE=-1 must be a positive"),
        ({"debug": "LOUD"}, r"NCCL_DEBUG='LOUD'.*VERSION, WARN, INFO, TRACE"),
        ({"debug_subsys": "INIT,FOO"}, r"NCCL_DEBUG_SUBSYS='INIT,FOO' has unknown \['FOO'\]"),
        ({"extra": {"GLOO_THING": "1"}}, r"extra key 'GLOO_THING' is not an NCCL variable"),
        ({"extra": {"NCCL_ALGO": "Tree"}}, r"use the field algo= instead"),
    ],
)
def test_invalid_settings_are_rejected_with_the_variable_and_what_is_accepted(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NCCLSettings(**kwargs)


def test_valid_settings_and_warnings():
    s = NCCLSettings(
        algo="allreduce:tree,ring;broadcast:ring",
        proto="^LL128",
        socket_nthreads=4,
        nsocks_perthread=4,
        ib_disable=True,
        p2p_level="nvl",
        extra={"NCCL_SOCKET_IFNAME": "eth0"},
    )
    assert s.env() == {
        "NCCL_ALGO": "allreduce:tree,ring;broadcast:ring",
        "NCCL_PROTO": "^LL128",
        "NCCL_SOCKET_NTHREADS": "4",
        "NCCL_NSOCKS_PERTHREAD": "4",
        "NCCL_IB_DISABLE": "1",
        "NCCL_P2P_LEVEL": "nvl",
        "NCCL_SOCKET_IFNAME": "eth0",
    }
    with pytest.warns(UserWarning, match="NCCL_BUFFSIZE=3000000 is not a power of two"):
        NCCLSettings(buffsize=3_000_000)
    with pytest.warns(UserWarning, match="NCCL_MIN_NCHANNELS is deprecated.*NCCL_MIN_CTAS"):
        NCCLSettings(extra={"NCCL_MIN_NCHANNELS": "4"})
