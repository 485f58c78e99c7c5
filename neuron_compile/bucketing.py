"""Shape bucketing: pad variable dimensions to a few fixed sizes so each size compiles once.

Trainium compiles one static graph per input shape. Padding the sequence (and optionally batch)
dimension up to the nearest of a few *buckets* bounds the number of compilations. The helpers
keep results exact:

- tokens and attention masks are padded at the **end** of the sequence, so with causal attention
  real positions never see padding;
- labels are padded with ``-100``, the default ``ignore_index`` of ``F.cross_entropy``, so the
  mean loss is taken over real tokens only;
- ``BucketedModule`` slices outputs back, so callers see unpadded results.

Pick the buckets from data with ``neuron_compile.bucket_planner.plan_buckets`` (or the CLI
``neuron-compile buckets plan lengths.txt``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .metrics import record_bucket_hit
from .shapes import bucket_for, note_buckets

IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index


def _check_buckets(buckets: Sequence[int]) -> list[int]:
    out = [int(b) for b in buckets]
    if not out or any(b <= 0 for b in out) or out != sorted(set(out)) or out != list(buckets):
        raise ValueError(f"buckets must be strictly increasing positive ints, got {buckets!r}")
    return out


def bucket_size(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket ``>= length``; ``ValueError`` if ``length`` exceeds the largest."""
    b = _check_buckets(buckets)
    note_buckets(b)  # a warm-up compile into one of them is expected, not a RecompileWarning
    size = bucket_for(length, b)
    if size is None:
        raise ValueError(
            f"length {length} is longer than the largest bucket {b[-1]}: add a bucket or "
            "truncate the input"
        )
    return size


def _pad_dim(t: torch.Tensor, dim: int, size: int, value: float | bool) -> torch.Tensor:
    dim = dim % t.dim()
    extra = size - t.shape[dim]
    if extra < 0:
        raise ValueError(f"cannot pad dim {dim} of size {t.shape[dim]} down to {size}")
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, t.new_full(shape, value)], dim=dim)


def pad_to_bucket(
    t: torch.Tensor, dim: int, buckets: Sequence[int], value: float | bool = 0
) -> tuple[torch.Tensor, int]:
    """Pad ``t`` at the end of ``dim`` to the smallest bucket that fits; return it and the
    original length. ``ValueError`` if ``t`` is longer than the largest bucket."""
    length = t.shape[dim]
    return _pad_dim(t, dim, bucket_size(length, buckets), value), length


def pad_to_multiple(t: torch.Tensor, dim: int, m: int, value: float | bool = 0) -> torch.Tensor:
    """Pad ``t`` at the end of ``dim`` to the next multiple of ``m``."""
    if m <= 0:
        raise ValueError(f"m must be positive, got {m}")
    length = t.shape[dim]
    return _pad_dim(t, dim, -(-length // m) * m, value)


def pad_attention_mask(mask: torch.Tensor, dim: int, buckets: Sequence[int]) -> torch.Tensor:
    """Pad a 1-for-real-token mask (bool or integer) with 0/False at the end of ``dim``."""
    return pad_to_bucket(mask, dim, buckets, value=False if mask.dtype == torch.bool else 0)[0]


def pad_labels(
    labels: torch.Tensor, dim: int, buckets: Sequence[int], value: int = IGNORE_INDEX
) -> torch.Tensor:
    """Pad labels with ``-100`` so ``F.cross_entropy`` (``ignore_index=-100``) skips padding."""
    return pad_to_bucket(labels, dim, buckets, value=value)[0]


# ---- DataLoader collation --------------------------------------------------------------------
def _pad_rows(t: torch.Tensor, batch: int, value: float | bool | None) -> torch.Tensor:
    """``t`` with rows added up to ``batch``: copies of its last row when ``value`` is None (so
    per-row work on a padded row, e.g. a mean under its mask, stays finite), else ``value``."""
    if value is not None or batch == t.shape[0] or t.shape[0] == 0:
        return _pad_dim(t, 0, batch, 0 if value is None else value)
    return torch.cat([t, t[-1:].expand(batch - t.shape[0], *t.shape[1:])])


def _collate_field(
    values: list[Any], seq_len: int, batch: int, value: float | bool, row_value: float | None
) -> torch.Tensor:
    tensors = [torch.as_tensor(v) for v in values]
    if tensors[0].dim() >= 1:
        tensors = [_pad_dim(t, 0, seq_len, value) for t in tensors]
    return _pad_rows(torch.stack(tensors), batch, row_value)


def _numbers(sample: list[Any]) -> bool:
    """A list of plain numbers is one sequence (token ids), not (input, labels...)."""
    return all(isinstance(x, (int, float)) for x in sample)


def bucketed_collate(
    buckets: Sequence[int],
    pad_value: float = 0,
    label_pad: int = IGNORE_INDEX,
    batch_buckets: Sequence[int] | None = None,
    *,
    label_key: str = "labels",
    mask_key: str | None = "attention_mask",
    name: str = "bucketed_collate",
) -> Callable[[list[Any]], Any]:
    """A ``collate_fn`` for ``torch.utils.data.DataLoader`` padding each batch to its bucket.

    Every field with a sequence dimension (dim 0 of the sample, dim 1 of the batch) is padded to
    the smallest bucket holding the batch's longest sample. Samples may be:

    - a tensor: returns the padded ``(batch, bucket)`` tensor (padded with ``pad_value``);
    - a tuple/list: element 0 is the input (``pad_value``), the others are labels (``label_pad``),
      e.g. ``(tokens, next_tokens)`` or ``(tokens, class_id)``; returns a tuple (a list of plain
      numbers is one sequence of token ids, as a tensor is);
    - a dict: ``label_key`` is padded with ``label_pad``, the others with ``pad_value``; when
      ``mask_key`` is set and absent, an int64 mask (1 = real token) is added.

    The attention mask is padded with 0 whatever ``pad_value`` is. ``batch_buckets`` also pads
    the batch dimension, so a short last batch does not compile a new graph: extra rows repeat
    the last sample (a row of padding under an all-zero mask makes a masked mean 0/0, NaN in the
    gradients) with labels ``label_pad``, so a loss over labels ignores them.

    Each batch counts one hit of its bucket in ``neuron_compile.bucket_metrics()`` under ``name``,
    with the samples' real lengths (of the first field with a sequence dimension) as real tokens
    and ``batch x bucket`` as padded tokens.
    """
    seq_buckets = _check_buckets(buckets)
    b_buckets = _check_buckets(batch_buckets) if batch_buckets is not None else None

    def collate(samples: list[Any]) -> Any:
        if not samples:
            raise ValueError(f"{name}: an empty batch has no bucket (no samples)")
        first = samples[0]
        as_tuple = isinstance(first, tuple) or (isinstance(first, list) and not _numbers(first))
        if isinstance(first, Mapping):
            fields = {k: [s[k] for s in samples] for k in first}
        elif as_tuple:
            fields = {i: [s[i] for s in samples] for i in range(len(first))}
        else:
            fields = {0: list(samples)}
        lengths = [
            int(torch.as_tensor(v).shape[0])
            for vs in fields.values()
            for v in vs
            if torch.as_tensor(v).dim() >= 1
        ]
        seq = bucket_size(max(lengths), seq_buckets) if lengths else 0
        batch = bucket_size(len(samples), b_buckets) if b_buckets else len(samples)
        seq_field = next((vs for vs in fields.values() if torch.as_tensor(vs[0]).dim() >= 1), None)
        if seq_field is not None:
            real = sum(int(torch.as_tensor(v).shape[0]) for v in seq_field)
            record_bucket_hit(name, seq, real, batch * seq)
        if isinstance(first, Mapping) and mask_key is not None and mask_key not in first:
            key0 = next(k for k in first if torch.as_tensor(first[k]).dim() >= 1)
            fields[mask_key] = [
                torch.ones(torch.as_tensor(s[key0]).shape[0], dtype=torch.long) for s in samples
            ]

        def is_label(key: Any) -> bool:
            return key == label_key if isinstance(first, Mapping) else key != 0

        def value_for(key: Any) -> float:
            if isinstance(first, Mapping) and key == mask_key:
                return 0  # padding is not a real token, whatever pad_value is
            return label_pad if is_label(key) else pad_value

        out = {
            k: _collate_field(vs, seq, batch, value_for(k), label_pad if is_label(k) else None)
            for k, vs in fields.items()
        }
        if isinstance(first, Mapping):
            return out
        if as_tuple:
            return tuple(out[i] for i in range(len(first)))
        return out[0]  # one sequence per sample: a tensor, or a list of token ids

    return collate


def bucket_batches(
    lengths: Sequence[int],
    buckets: Sequence[int],
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
) -> list[list[int]]:
    """Batches of sample indices in which every sample falls in the same bucket.

    With random batching a batch is padded to the bucket of its *longest* sample, so most
    batches land in the largest buckets. Grouping samples by bucket first (then shuffling
    within and across buckets) makes the padding what the planner predicted per sample.
    Use as ``DataLoader(dataset, batch_sampler=bucket_batches(...), collate_fn=...)``.
    """
    b = _check_buckets(buckets)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    g = torch.Generator().manual_seed(seed)
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(bucket_size(n, b), []).append(i)
    batches = []
    for size in sorted(groups):
        ids = groups[size]
        if shuffle:
            ids = [ids[j] for j in torch.randperm(len(ids), generator=g).tolist()]
        for start in range(0, len(ids), batch_size):
            chunk = ids[start : start + batch_size]
            if len(chunk) == batch_size or not drop_last:
                batches.append(chunk)
    if shuffle:
        batches = [batches[j] for j in torch.randperm(len(batches), generator=g).tolist()]
    return batches


# ---- module wrapper --------------------------------------------------------------------------
@dataclass
class BucketStats:
    """Calls per bucket and the real vs padded elements of the bucketed inputs."""

    calls: int = 0
    real: int = 0
    padded: int = 0

    @property
    def padding_fraction(self) -> float:
        """Fraction of the padded inputs that is padding."""
        return 1 - self.real / self.padded if self.padded else 0.0


class BucketedModule(torch.nn.Module):
    """Pads inputs to buckets along ``dim`` and slices outputs back to the real length.

    Wrap the *compiled* module, so the padding runs outside the graph and each bucket is one
    static compile::

        model = BucketedModule(torch.compile(gpt, backend="neuron"), [64, 128, 256],
                               pad_values={"targets": -100})

    Every tensor argument whose size along ``dim`` equals the first such argument's is padded (with
    ``pad_values[name]``, default 0; keys are ``forward`` parameter names or positional indices).
    ``mask_arg`` names an attention-mask parameter: a passed mask is padded with 0, a missing one
    is created (1 = real token). Output tensors whose ``dim`` has the bucket's size are sliced
    back (so an output that happens to have that size along ``dim`` for another reason is sliced
    too). ``batch_buckets`` also pads dim 0: added rows repeat the last real row, except in
    arguments with a ``pad_values`` entry (labels), which get that value; padded rows are sliced
    off the outputs, and with labels padded to -100 a mean cross-entropy loss is unchanged. A
    module with BatchNorm computing batch statistics (training mode) would count the added rows
    in them, so padding its batch raises ``OptionsError`` (NC001). ``stats`` counts calls and
    padding per bucket of this wrapper; the same counts go to ``neuron_compile.bucket_metrics()``
    under ``name`` (default ``BucketedModule(<wrapped class or function name>)``).
    """

    def __init__(
        self,
        module: torch.nn.Module | Callable[..., Any],
        buckets: Sequence[int],
        dim: int = 1,
        *,
        pad_values: Mapping[str | int, float] | None = None,
        mask_arg: str | None = None,
        batch_buckets: Sequence[int] | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.buckets = _check_buckets(buckets)
        self.batch_buckets = _check_buckets(batch_buckets) if batch_buckets is not None else None
        self.dim = dim
        self.pad_values = dict(pad_values or {})
        self.mask_arg = mask_arg
        self.stats: dict[int, BucketStats] = {}
        target = getattr(module, "_orig_mod", module)
        if name is None:
            label = type(target).__name__ if isinstance(target, torch.nn.Module) else None
            name = f"BucketedModule({label or getattr(target, '__name__', type(target).__name__)})"
        self.name = name
        try:
            self._signature: inspect.Signature | None = inspect.signature(
                target.forward if isinstance(target, torch.nn.Module) else target
            )
        except (TypeError, ValueError):
            self._signature = None

    def _named(self, args: tuple, kwargs: dict) -> list[tuple[str | int, str | int, Any]]:
        """``(pad_values key, slot, value)``: slot is the positional index or keyword."""
        names: list[str | int] = list(range(len(args)))
        if self._signature is not None:
            try:
                bound = self._signature.bind_partial(*args)
                names = list(bound.arguments)[: len(args)]
            except TypeError:
                pass
        named: list[tuple[str | int, str | int, Any]] = [
            (names[i] if i < len(names) else i, i, a) for i, a in enumerate(args)
        ]
        named.extend((k, k, v) for k, v in kwargs.items())
        return named

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        named = self._named(args, kwargs)
        seq_inputs = [v for _, _, v in named if isinstance(v, torch.Tensor) and self._has_dim(v)]
        if not seq_inputs:
            raise ValueError(f"BucketedModule: no tensor argument has a dim {self.dim}")
        length, rows = seq_inputs[0].shape[self.dim], seq_inputs[0].shape[0]
        bucket = bucket_size(length, self.buckets)
        batch = bucket_size(rows, self.batch_buckets) if self.batch_buckets else rows
        if self.mask_arg is not None and self.mask_arg not in [k for k, _, _ in named]:
            mask = torch.ones(rows, length, dtype=torch.long, device=seq_inputs[0].device)
            named.append((self.mask_arg, self.mask_arg, mask))
        new_args, new_kwargs = list(args), {}
        if batch != rows:
            self._check_batch_padding()
        for key, slot, v in named:
            if isinstance(v, torch.Tensor):
                # A pad value by parameter name, else by position (bind_partial names them all).
                given = self.pad_values.get(key, self.pad_values.get(slot))
                value = 0 if self.mask_arg in (key, slot) else given or 0
                if self._has_dim(v) and v.shape[self.dim] == length:
                    v = _pad_dim(v, self.dim, bucket, value)
                if batch != rows and v.dim() >= 1 and v.shape[0] == rows:
                    v = _pad_rows(v, batch, given)
            if isinstance(slot, int):
                new_args[slot] = v
            else:
                new_kwargs[slot] = v
        stats = self.stats.setdefault(bucket, BucketStats())
        stats.calls += 1
        stats.real += rows * length
        stats.padded += batch * bucket
        record_bucket_hit(self.name, bucket, rows * length, batch * bucket)
        out = self.module(*new_args, **new_kwargs)
        return self._unpad(out, length, bucket, rows, batch)

    def _has_dim(self, t: torch.Tensor) -> bool:
        """``t`` has the bucketed dim (``dim=-1`` too: a 0-d loss has none)."""
        return -t.dim() <= self.dim < t.dim()

    def _check_batch_padding(self) -> None:
        from .errors import OptionsError

        target = getattr(self.module, "_orig_mod", self.module)
        modules = target.named_modules() if isinstance(target, torch.nn.Module) else ()
        for name, m in modules:
            if not isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                continue
            if m.training or not m.track_running_stats:  # normalizes with batch statistics
                raise OptionsError(
                    f"{self.name}: batch_buckets pads the batch with extra rows, and "
                    f"{name or type(m).__name__} ({type(m).__name__}) computes batch statistics "
                    "over every row, so the padded batch would normalize differently from "
                    "eager. Leave out batch_buckets for this module (DataLoader(drop_last=True) "
                    "keeps every batch the same size), or pad only in eval()."
                )

    def _unpad(self, out: Any, length: int, bucket: int, rows: int, batch: int) -> Any:
        if isinstance(out, torch.Tensor):
            if bucket != length and self._has_dim(out) and out.shape[self.dim] == bucket:
                out = out.narrow(self.dim, 0, length)
            if batch != rows and out.dim() >= 1 and out.shape[0] == batch:
                out = out.narrow(0, 0, rows)
            return out
        if isinstance(out, tuple) and hasattr(out, "_fields"):
            return type(out)(*(self._unpad(o, length, bucket, rows, batch) for o in out))
        if isinstance(out, (tuple, list)):
            return type(out)(self._unpad(o, length, bucket, rows, batch) for o in out)
        if isinstance(out, dict):
            return {k: self._unpad(v, length, bucket, rows, batch) for k, v in out.items()}
        return out
