"""Padding helpers keep causal-LM loss and classification logits identical to unpadded eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from train_gpt import GPTConfig, TinyGPT

import neuron_compile
from neuron_compile.bucketing import (
    BucketedModule,
    bucket_batches,
    bucket_size,
    bucketed_collate,
    pad_attention_mask,
    pad_labels,
    pad_to_bucket,
    pad_to_multiple,
)

CFG = GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=2, d_model=32)


def _tokens(b: int, t: int, seed: int) -> torch.Tensor:
    return torch.randint(1, CFG.vocab_size, (b, t), generator=torch.Generator().manual_seed(seed))


# ---- tensor helpers --------------------------------------------------------------------------
def test_pad_to_bucket_pads_at_the_end_and_returns_the_length():
    t = torch.arange(6).view(2, 3)
    padded, n = pad_to_bucket(t, 1, [2, 4, 8], value=-1)
    assert n == 3 and torch.equal(padded, torch.tensor([[0, 1, 2, -1], [3, 4, 5, -1]]))
    same, n = pad_to_bucket(t, 1, [3, 5])
    assert same is t and n == 3
    assert pad_to_bucket(t, 0, [4])[0].shape == (4, 3)


def test_pad_to_bucket_rejects_lengths_past_the_largest_bucket():
    with pytest.raises(ValueError, match="longer than the largest bucket 4"):
        pad_to_bucket(torch.zeros(1, 5), 1, [2, 4])
    with pytest.raises(ValueError, match="strictly increasing"):
        bucket_size(3, [4, 2])


def test_pad_to_multiple_and_mask_and_labels():
    assert pad_to_multiple(torch.ones(2, 5), -1, 4).shape == (2, 8)
    assert pad_to_multiple(torch.ones(2, 8), 1, 4).shape == (2, 8)
    mask = pad_attention_mask(torch.ones(1, 3, dtype=torch.bool), 1, [4])
    assert mask.tolist() == [[True, True, True, False]]
    assert pad_labels(torch.tensor([[7, 8]]), 1, [3]).tolist() == [[7, 8, -100]]


# ---- causal LM -------------------------------------------------------------------------------
@pytest.mark.parametrize("t", [5, 16, 21])
def test_bucketed_causal_lm_loss_logits_and_grads_match_unpadded(t):
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    idx, targets = _tokens(3, t, seed=t), _tokens(3, t, seed=t + 1)
    wrapped = BucketedModule(model, [8, 16, 32], pad_values={"targets": -100})

    ref = model(idx, targets)
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    loss = wrapped(idx, targets)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    torch.testing.assert_close(loss, ref)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)
    logits = wrapped(idx)
    assert logits.shape == (3, t, CFG.vocab_size)
    torch.testing.assert_close(logits, model(idx))
    bucket = bucket_size(t, [8, 16, 32])
    assert wrapped.stats[bucket].calls == 2
    assert wrapped.stats[bucket].padding_fraction == pytest.approx(1 - t / bucket)


def test_batch_bucket_rows_do_not_change_the_loss():
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    idx, targets = _tokens(3, 7, 1), _tokens(3, 7, 2)
    wrapped = BucketedModule(model, [8], pad_values={"targets": -100}, batch_buckets=[4, 8])
    torch.testing.assert_close(wrapped(idx, targets), model(idx, targets))
    assert wrapped(idx).shape == (3, 7, CFG.vocab_size)
    assert wrapped.stats[8].padded == 2 * 4 * 8


def test_padding_labels_with_zero_instead_of_minus_100_changes_the_loss():
    """The control: the -100 label padding is what makes the loss exact."""
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    idx, targets = _tokens(2, 5, 3), _tokens(2, 5, 4)
    wrong = BucketedModule(model, [8], pad_values={"targets": 0})
    assert not torch.allclose(wrong(idx, targets), model(idx, targets))


# ---- classification --------------------------------------------------------------------------
class Classifier(nn.Module):
    """Bidirectional attention with a key-padding mask, masked mean pool, linear head."""

    def __init__(self, vocab: int = 40, d: int = 16, classes: int = 5) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.head = nn.Linear(d, classes)

    def forward(self, idx, attention_mask=None, labels=None):
        if attention_mask is None:
            attention_mask = torch.ones_like(idx)
        keep = attention_mask.bool()
        q, k, v = self.qkv(self.emb(idx)).chunk(3, dim=-1)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, :])
        w = keep.unsqueeze(-1).to(h.dtype)
        logits = self.head((h * w).sum(1) / w.sum(1))
        if labels is None:
            return logits
        return logits, F.cross_entropy(logits, labels)


@pytest.mark.parametrize("t", [3, 9, 16])
def test_bucketed_classifier_logits_and_loss_match_unpadded(t):
    torch.manual_seed(1)
    model = Classifier()
    idx = torch.randint(0, 40, (5, t), generator=torch.Generator().manual_seed(t))
    labels = torch.tensor([0, 1, 2, 3, 4])
    wrapped = BucketedModule(
        model, [4, 16], mask_arg="attention_mask", pad_values={"labels": -100}, batch_buckets=[8]
    )
    ref_logits, ref_loss = model(idx, labels=labels)
    logits, loss = wrapped(idx, labels=labels)
    assert logits.shape == (5, 5)
    torch.testing.assert_close(logits, ref_logits)
    torch.testing.assert_close(loss, ref_loss)
    if t not in (4, 16):  # padded without the mask the pooled logits are wrong: the control
        no_mask = BucketedModule(model, [4, 16])
        assert not torch.allclose(no_mask(idx), ref_logits)


# ---- DataLoader collation --------------------------------------------------------------------
def _lm_samples(lengths: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for i, n in enumerate(lengths):
        seq = _tokens(1, n + 1, seed=100 + i)[0]
        out.append((seq[:-1], seq[1:]))
    return out


def test_collate_pads_each_batch_to_its_bucket_and_keeps_the_loss_exact():
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    lengths = [3, 5, 9, 12, 20, 7, 30, 2]
    samples = _lm_samples(lengths)
    loader = DataLoader(samples, batch_size=3, collate_fn=bucketed_collate([8, 16, 32]))
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(3, 16), (3, 32), (2, 32)]
    assert torch.equal(batches[0][1][0, 3:], torch.full((13,), -100))
    assert torch.equal(batches[0][0][0, 3:], torch.zeros(13, dtype=torch.long))
    for b, chunk in zip(batches, [samples[0:3], samples[3:6], samples[6:8]], strict=True):
        # Unpadded reference: every sequence on its own, CE summed over real tokens.
        total = sum(F.cross_entropy(model(x[None])[0], y, reduction="sum") for x, y in chunk)
        ref = total / sum(len(x) for x, _ in chunk)
        torch.testing.assert_close(model(*b), ref)


def test_collate_dicts_get_a_mask_and_batch_buckets_pad_rows():
    samples = [{"input_ids": torch.arange(1, n + 1), "labels": torch.tensor(n)} for n in (2, 5)]
    batch = bucketed_collate([4, 8], batch_buckets=[4])(samples)
    assert batch["input_ids"].shape == (4, 8) and batch["input_ids"][0].tolist()[:3] == [1, 2, 0]
    assert batch["attention_mask"].tolist()[:2] == [[1, 1, 0, 0, 0, 0, 0, 0], [1] * 5 + [0] * 3]
    # Added rows repeat the last sample (its mask too: a masked mean stays finite), labels -100.
    assert batch["attention_mask"][2:].tolist() == [[1] * 5 + [0] * 3] * 2
    assert torch.equal(batch["input_ids"][2:], batch["input_ids"][1:2].expand(2, 8))
    assert batch["labels"].tolist() == [2, 5, -100, -100]
    plain = bucketed_collate([4], pad_value=7)([torch.tensor([1, 2, 3])])
    assert plain.tolist() == [[1, 2, 3, 7]]


def test_collate_pads_the_mask_with_zero_whatever_the_pad_value():
    """pad_value=1 (RoBERTa's pad id) padded the attention mask with 1: padding counted as real
    tokens."""
    sample = {"input_ids": torch.arange(3), "labels": torch.arange(3)}
    for mask in (None, torch.ones(3, dtype=torch.long)):
        given = sample if mask is None else {**sample, "attention_mask": mask}
        out = bucketed_collate([4, 8], pad_value=1)([given])
        assert out["input_ids"].tolist() == [[0, 1, 2, 1]] and out["labels"].tolist() == [
            [0, 1, 2, -100]
        ]
        assert out["attention_mask"].tolist() == [[1, 1, 1, 0]]


def test_buckets_must_be_whole_numbers():
    with pytest.raises(ValueError, match="strictly increasing positive ints"):
        bucket_size(3, [4.5, 8])  # was silently bucket 4


def test_bucket_batches_group_samples_by_bucket():
    lengths = [3, 30, 5, 7, 12, 31, 2, 16, 9]
    batches = bucket_batches(lengths, [8, 16, 32], 2, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len({bucket_size(lengths[i], [8, 16, 32]) for i in b}) == 1
    assert sorted(len(b) for b in batches) == [1, 2, 2, 2, 2]  # 4 | 3 | 2 samples per bucket
    dropped = bucket_batches(lengths, [8, 16, 32], 2, drop_last=True, shuffle=False)
    assert dropped == [[0, 2], [3, 6], [4, 7], [1, 5]]
    assert bucket_batches(lengths, [8, 16, 32], 2, seed=3) == batches  # deterministic


# ---- compiled: one graph per bucket ----------------------------------------------------------
def test_compiled_bucketed_model_compiles_once_per_bucket_and_matches_eager():
    torch.manual_seed(0)
    model = TinyGPT(CFG)
    compiled = torch.compile(model, backend="neuron", dynamic=False)
    wrapped = BucketedModule(compiled, [8, 16], pad_values={"targets": -100})
    with torch.no_grad():
        for t in (5, 7, 11, 8, 13, 16):
            idx, targets = _tokens(2, t, t), _tokens(2, t, t + 50)
            torch.testing.assert_close(wrapped(idx, targets), model(idx, targets))
    records = neuron_compile.metrics()
    assert [r.kind for r in records] == ["inference", "inference"]
    assert [r.recompile for r in records] == [False, True]
    assert sorted(wrapped.stats) == [8, 16] and wrapped.stats[16].calls == 3


def test_pad_values_by_position_reach_their_argument():
    """pad_values={1: -100} was never matched once the signature named the argument, so the
    targets were padded with 0 and the loss changed (1.28 instead of 1.90)."""

    def lm(idx, targets):
        logits = F.one_hot(idx, 5).float().reshape(-1, 5)
        return F.cross_entropy(logits, targets.reshape(-1))

    idx, targets = torch.tensor([[1, 2, 3]]), torch.tensor([[2, 3, 4]])
    ref = lm(idx, targets)
    for pad_values in ({"targets": -100}, {1: -100}):
        torch.testing.assert_close(
            BucketedModule(lm, [8], pad_values=pad_values)(idx, targets), ref
        )


class _MaskedMeanClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(10, 8), nn.Linear(8, 3)

    def forward(self, ids, attention_mask, y):
        m = attention_mask.unsqueeze(-1).float()
        pooled = (self.emb(ids) * m).sum(1) / m.sum(1)
        return F.cross_entropy(self.head(pooled), y)


@pytest.mark.filterwarnings("ignore::neuron_compile.compiler.DowncastWarning")  # ids, mask
@pytest.mark.parametrize("compiled", [False, True])
def test_padded_batch_rows_keep_a_masked_mean_and_its_gradients_finite(compiled):
    """Added rows were all padding under an all-zero mask: 0/0 in their masked mean, so every
    gradient was NaN although the loss (over real rows) was right."""
    torch.manual_seed(0)
    model = _MaskedMeanClassifier()
    ids, mask, y = (
        torch.randint(0, 10, (3, 5)),
        torch.ones(3, 5, dtype=torch.long),
        torch.tensor([0, 2, 1]),
    )
    ref = model(ids, mask, y)
    ref.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    run = torch.compile(model, backend="neuron") if compiled else model
    wrapped = BucketedModule(run, [8], mask_arg="attention_mask", pad_values={"y": -100},
                             batch_buckets=[4])  # fmt: skip
    loss = wrapped(ids, mask, y)
    loss.backward()
    torch.testing.assert_close(loss, ref)
    for p, g in zip(model.parameters(), ref_grads, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_padding_the_batch_of_a_training_batchnorm_is_refused():
    """Padded rows entered BatchNorm's batch statistics: logits off by 0.035, running_mean by
    2e-3. In eval (running statistics) the padding is exact, so it is allowed there."""
    from neuron_compile.errors import OptionsError

    net = nn.Sequential(nn.Conv1d(2, 4, 1), nn.BatchNorm1d(4))
    wrapped = BucketedModule(net, [8], dim=2, batch_buckets=[4])
    x = torch.randn(3, 2, 5)
    with pytest.raises(OptionsError, match=r"NC001.*BatchNorm1d.*batch statistics"):
        wrapped(x)
    wrapped(torch.randn(4, 2, 5))  # a full batch needs no padding
    net.eval()
    torch.testing.assert_close(wrapped(x), net(x))


def test_edge_inputs_get_clear_errors_or_work():
    """Each of these raised IndexError or a range() error from inside the helpers."""
    with pytest.raises(ValueError, match="empty batch"):
        bucketed_collate([4])([])
    # Lists of token ids of different lengths are sequences, not (input, labels) tuples.
    assert bucketed_collate([4])([[1, 2, 3], [4, 5]]).tolist() == [[1, 2, 3, 0], [4, 5, 0, 0]]
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        bucket_batches([3, 5], [8], batch_size=0)

    def lm(x):  # a 0-d loss beside the bucketed dim -1
        return x.sum(-1), x.float().pow(2).mean()

    per_row, loss = BucketedModule(lm, [8], dim=-1)(torch.ones(2, 5))
    assert per_row.tolist() == [5.0, 5.0] and loss.dim() == 0
