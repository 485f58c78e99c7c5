"""Runtime bucket report: ``neuron_compile.bucket_metrics()`` hit counts and padding fractions."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
import torch.nn as nn

import neuron_compile
from neuron_compile import BucketRecord, bucket_metrics
from neuron_compile.bucketing import BucketedModule, bucketed_collate
from neuron_compile.metrics import record_bucket_hit


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x


def _summary() -> list[tuple[str, int, int, int, int]]:
    return [(r.source, r.bucket, r.hits, r.real_tokens, r.padded_tokens) for r in bucket_metrics()]


def test_bucketed_module_records_hits_and_padding_per_bucket():
    wrapped = BucketedModule(Scale(), [8, 16])
    for t in (3, 5, 10, 8):
        out = wrapped(torch.ones(2, t))
        assert out.shape == (2, t)
    name = "BucketedModule(Scale)"
    # bucket 8: lengths 3, 5, 8 on 2 rows -> real 32 of 48; bucket 16: length 10 -> 20 of 32.
    assert _summary() == [(name, 8, 3, 32, 48), (name, 16, 1, 20, 32)]
    r8, r16 = bucket_metrics()
    assert r8.padding_fraction == pytest.approx(1 / 3)
    assert r16.padding_fraction == pytest.approx(0.375)
    # The per-wrapper stats and the global report agree.
    assert wrapped.stats[8].calls == r8.hits and wrapped.stats[8].padded == r8.padded_tokens


def test_batch_bucket_rows_count_as_padding():
    wrapped = BucketedModule(Scale(), [8], batch_buckets=[4], name="clf")
    wrapped(torch.ones(3, 6))
    (rec,) = bucket_metrics()
    assert (rec.source, rec.bucket, rec.hits, rec.real_tokens, rec.padded_tokens) == (
        "clf",
        8,
        1,
        18,
        32,
    )
    assert rec.padding_fraction == pytest.approx(1 - 18 / 32)
    assert rec.as_dict()["padding_fraction"] == pytest.approx(14 / 32)


def test_bucketed_collate_counts_each_samples_real_length():
    collate = bucketed_collate([4, 8], batch_buckets=[2], name="loader")
    seqs = [torch.arange(n) for n in (2, 3, 7, 4, 1)]
    collate([(seqs[0], seqs[0]), (seqs[1], seqs[1])])  # bucket 4: 5 real of 2 x 4
    collate([(seqs[2], seqs[2])])  # bucket 8, batch padded to 2: 7 real of 16
    collate([(seqs[3], seqs[3]), (seqs[4], seqs[4])])  # bucket 4: 5 real of 8
    assert _summary() == [("loader", 4, 2, 10, 16), ("loader", 8, 1, 7, 16)]
    assert [r.padding_fraction for r in bucket_metrics()] == pytest.approx([0.375, 9 / 16])


def test_collate_dict_samples_and_default_name():
    collate = bucketed_collate([4])
    collate([{"input_ids": torch.arange(3), "labels": torch.arange(3)}])
    assert _summary() == [("bucketed_collate", 4, 1, 3, 4)]


def test_sources_with_different_names_are_separate_and_equal_names_add_up():
    a, b = BucketedModule(Scale(), [4], name="a"), BucketedModule(Scale(), [4], name="a")
    c = BucketedModule(Scale(), [4], name="c")
    a(torch.ones(1, 2))
    b(torch.ones(1, 3))
    c(torch.ones(1, 4))
    assert _summary() == [("a", 4, 2, 5, 8), ("c", 4, 1, 4, 4)]
    assert bucket_metrics()[1].padding_fraction == 0.0


def test_reset_clears_bucket_records_and_snapshots_are_not_live():
    wrapped = BucketedModule(Scale(), [4], name="m")
    wrapped(torch.ones(1, 1))
    snapshot = bucket_metrics()
    wrapped(torch.ones(1, 1))
    assert snapshot[0].hits == 1 and bucket_metrics()[0].hits == 2
    neuron_compile.reset_metrics()
    assert bucket_metrics() == []
    wrapped(torch.ones(1, 3))
    assert _summary() == [("m", 4, 1, 3, 4)]


def test_concurrent_hits_are_all_counted():
    def work() -> None:
        for _ in range(500):
            record_bucket_hit("threads", 8, 3, 8)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _summary() == [("threads", 8, 4000, 12000, 32000)]


def test_record_bucket_hit_rejects_more_real_than_padded():
    with pytest.raises(ValueError, match="real_tokens <= padded_tokens"):
        record_bucket_hit("x", 4, 5, 4)
    assert bucket_metrics() == []


def test_compiled_bucketed_module_one_graph_per_bucket_hit_and_metrics_type_unchanged():
    compiled = torch.compile(Scale(), backend="neuron", dynamic=False)
    wrapped = BucketedModule(compiled, [4, 8])
    # The compile for bucket 8 is a warm-up compile (a size BucketedModule pads to): no warning.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", neuron_compile.RecompileWarning)
        for t in (1, 3, 6, 2, 7):
            torch.testing.assert_close(wrapped(torch.full((2, t), 1.5)), torch.full((2, t), 3.0))
    records = neuron_compile.metrics()
    assert all(isinstance(r, neuron_compile.GraphRecord) for r in records)
    assert [r.calls for r in records] == [3, 2]  # graphs for bucket 4, then bucket 8
    buckets = bucket_metrics()
    assert all(isinstance(r, BucketRecord) for r in buckets)
    assert _summary() == [
        ("BucketedModule(Scale)", 4, 3, 12, 24),
        ("BucketedModule(Scale)", 8, 2, 26, 32),
    ]
    assert [r.hits for r in buckets] == [r.calls for r in records]
