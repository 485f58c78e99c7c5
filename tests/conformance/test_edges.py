"""Zero-size and rank-0 edges (``edges.py``) of the op families whose shape rules have edges:
reductions, scans, normalizations, sorting, indexing, shape ops. Each sweep runs in its own
process, so an eager segfault on an edge fails this test instead of killing the session.
The whole OpInfo database: ``python -m tests.conformance.edges`` (documented in
docs/conformance.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT

FAMILIES = {
    "reductions": "sum,mean,prod,amax,amin,max.reduction_with_dim,min.reduction_with_dim,"
    "argmax,argmin,var,std,logsumexp,norm,all,any,count_nonzero",
    "scans": "cumsum,cumprod,cummax,cummin,logcumsumexp",
    "normalizations": "softmax,log_softmax,nn.functional.layer_norm,nn.functional.normalize",
    "sorting": "sort,argsort,topk,kthvalue,msort",
    "indexing": "gather,index_select,take_along_dim,index_add,scatter_add,masked_fill,where",
    "shape": "cat,stack,flatten,reshape,permute,transpose,flip,roll,repeat,tile,narrow,diag,"
    "tril,triu,trace,unbind,split,chunk",
    "matmul": "mm,bmm,matmul,addmm,outer,dot",
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_edges_fall_back_or_match_eager(family, tmp_path):
    env = {**os.environ, "NEURON_COMPILE_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "tests.conformance.edges"]
        + ["--ops", FAMILIES[family]],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = [line for line in proc.stdout.splitlines() if line.endswith((": pass", ": fallback"))]
    assert ran, "no edge compiled: the sweep selected nothing"


def test_every_registered_lowering_has_edges():
    """Registered ops that no OpInfo entry reaches have hand-written edge cases
    (``registered_edges.py``), or say which entry reaches them."""
    import neuron_compile.lowering.stablehlo  # noqa: F401 - registers the rules
    import neuron_compile.trainium.lowering  # noqa: F401 - and the trn kernel ops' references
    from neuron_compile.lowering.registry import registered_ops
    from tests.conformance.registered_edges import opinfo_names, unaccounted

    missing = unaccounted(registered_ops(), opinfo_names())
    assert not missing, f"add edge cases (or a REACHED_BY entry) for: {missing}"


def test_hand_written_edges_fall_back_or_match_eager(tmp_path):
    env = {**os.environ, "NEURON_COMPILE_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "tests.conformance.registered_edges"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count(": pass") >= 40, proc.stdout[-3000:]
