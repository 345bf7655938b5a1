"""Inferred data flow and the fusion rules against exact data flow: the Execution Trace corpus.

`fixtures/corpus/` holds Kineto traces recorded together with an ExecutionTraceObserver
(`fixtures/record_corpus.py`: transformers 5.23 architectures from their configs, random
weights, CPU). The ET's tensor ids give each trace its exact producer -> consumer edges
(`execution_trace.tensor_edges`), so every test here checks traceq against a fact that
was recorded, not against what the code is expected to do. Each failure class of issue 10
that the corpus shows has a test; each fails on the code before its fix.
"""

from __future__ import annotations

import sys

import polars as pl
import pytest
from conftest import CORPUS, corpus_et, corpus_paths, corpus_trace

import traceq
from traceq.relations.dataflow import dataflow, module_calls
from traceq.relations.dataflow.execution_trace import match_ops, tensor_edges
from traceq.rules.config import Config
from traceq.rules.engine import run
from traceq.rules.finding import Finding

FUSION = ("TQ101", "TQ102", "TQ103", "TQ104", "TQ105")
sys.path.insert(0, str(CORPUS.parent.parent / "benchmarks"))


def _pairs(frame: pl.DataFrame) -> set[tuple[int, int]]:
    return set(frame.select("producer", "consumer").unique().iter_rows())


def _findings(trace: traceq.Trace, *codes: str) -> list[Finding]:
    return run(trace, Config(select=list(codes or FUSION))).findings


def _exact_findings(name: str, *codes: str) -> list[Finding]:
    trace = traceq.load(corpus_paths(name)[0])
    trace.__dict__["dataflow"] = dataflow(
        trace, trace.dataflow_ops, execution_trace=corpus_et(name)
    )
    return _findings(trace, *codes)


def _keys(findings: list[Finding]) -> set[tuple[str, frozenset[int]]]:
    return {(f.rule, frozenset(f.ops)) for f in findings}


# -- class 1: repeated forward calls ------------------------------------------------------


@pytest.mark.parametrize("name", ["bert_ensemble", "vit_repeated", "gpt2_generate"])
def test_no_inferred_edge_joins_two_forward_calls(name: str) -> None:
    """Except a value the loop carries (`loop_carried`: a KV cache's past, read by the
    next `generate` step's `cat`), each such edge one the ET has."""
    trace = corpus_trace(name)
    calls = module_calls(trace, trace.dataflow_ops).select("event", "_top")
    tops = calls.filter(pl.col("_top").is_not_null())
    assert tops["_top"].n_unique() >= 2  # the trace does hold several forward calls
    crossing = (
        trace.dataflow.join(tops.rename({"event": "producer", "_top": "_p"}), on="producer")
        .join(tops.rename({"event": "consumer", "_top": "_c"}), on="consumer")
        .filter(pl.col("_p") != pl.col("_c"))
    )
    carried = crossing.filter(pl.col("evidence") == "shape+loop-carried")
    assert crossing.height == carried.height
    exact = tensor_edges(trace, corpus_et(name)).select("producer", "consumer")
    assert carried.join(exact, on=["producer", "consumer"], how="anti").height == 0


def test_three_calls_of_one_model_give_the_et_findings() -> None:
    """ViT called three times in one step: before call scoping, calls 2 and 3 linked to
    call 1's same-shaped ops; 8 of the 15 findings were made, and 1 wrong one."""
    got, truth = _findings(corpus_trace("vit_repeated")), _exact_findings("vit_repeated")
    assert len(truth) == 15
    assert _keys(got) == _keys(truth)


# -- class 2: a module called twice -------------------------------------------------------


def test_a_block_called_twice_reads_its_own_call() -> None:
    """`block(block(x))`, `relu(head(relu(head(x))))`: every edge is the ET's (the old
    same-module-path preference linked call 2's input to call 1's output)."""
    trace = corpus_trace("shared_block")
    exact = _pairs(tensor_edges(trace, corpus_et("shared_block"), trace.dataflow_ops))
    assert len(exact) == 12
    assert _pairs(trace.dataflow) == exact


# -- class 5: ops that return or overwrite their input -------------------------------------


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_ops_returning_their_input_are_not_producers(name: str) -> None:
    """A no-op `to` (RMSNorm's `.to(float32)` on fp32) and eval-mode dropout write
    nothing; the ET names the tensor's writer, and so must the inferred edges."""
    trace, et = corpus_trace(name), corpus_et(name)
    wrote_nothing = et.filter(
        pl.col("name").is_in(["aten::to", "aten::dropout"]) & (pl.col("outputs").list.len() == 0)
    ).select("et_id")
    aliases = match_ops(trace, et).join(wrote_nothing, on="et_id")["event"]
    assert aliases.len() >= 4
    assert trace.dataflow.filter(pl.col("producer").is_in(aliases.implode())).height == 0
    # their readers read the writer the ET names
    exact = _pairs(tensor_edges(trace, et, trace.dataflow_ops))
    readers = trace.dataflow.filter(pl.col("evidence").str.contains("returned-input"))
    assert readers.height > 0
    right = sum(pair in exact for pair in _pairs(readers))
    assert right / len(_pairs(readers)) >= 0.75


@pytest.mark.parametrize("name", ["tp_block", "tp_train"])
def test_a_layer_reads_the_output_of_the_layer_chained_before_it(name: str) -> None:
    """Megatron layers called one after another by the script (`x = layer_1(layer_0(x))`,
    no module around them): each layer's first norm reads the residual `add` that ended the
    layer before, as the ET says, and the add+LayerNorm fusion (TQ107) is found on inferred
    data flow as on exact. Values used never to cross from one outermost module call into
    another, which is right only for calls of the same model (`generate`, an ensemble)."""
    trace = corpus_trace(name)
    exact = _pairs(tensor_edges(trace, corpus_et(name), trace.dataflow_ops))
    names = dict(trace.dataflow_ops.select("event", "name").iter_rows())
    residual_into_norm = {
        (p, c) for p, c in exact if names[c] == "aten::layer_norm" and names[p] == "aten::add"
    }
    assert residual_into_norm and residual_into_norm <= _pairs(trace.dataflow)
    assert _keys(_findings(trace, "TQ107")) == _keys(_exact_findings(name, "TQ107"))


def test_in_place_ops_match_the_et() -> None:
    """`h.mul_(0.5).add_(x).relu_()`, `proj(h).sigmoid_()`, `h * g`: the sigmoid_ reads
    the GEMM just before it, the mul reads what relu_ and sigmoid_ wrote."""
    trace = corpus_trace("inplace")
    assert _keys(_findings(trace)) == _keys(_exact_findings("inplace"))
    rules = sorted(f.rule for f in _findings(trace))
    assert rules == ["TQ102", "TQ104"]


@pytest.mark.parametrize("name", ["inplace", "t5"])
def test_in_place_ops_update_a_live_value(name: str) -> None:
    """`h.mul_(0.5).add_(x)`, T5's `buckets.add_(...)`: an in-place op updates a value that
    is live; it was once given a replaced ("hidden") value of the shape, as a written-out
    pointwise expression is."""
    trace = corpus_trace(name)
    exact = _pairs(tensor_edges(trace, corpus_et(name), trace.dataflow_ops))
    in_place = trace.dataflow.filter(pl.col("consumer_name").str.ends_with("_"))
    assert in_place.height >= 2
    assert _pairs(in_place) <= exact


# -- class 7 and 9: written-out activations --------------------------------------------------


def test_gpt2_conv1d_gelu_new_is_a_split_gemm_activation() -> None:
    """GPT-2's Conv1D: `addmm` on [B*T, 4H], `view` to [B, T, 4H], then `gelu_new` as 8
    pointwise ops: TQ102 (it was read as a TQ104 chain)."""
    found = _findings(corpus_trace("gpt2"))
    assert [f.rule for f in found] == ["TQ102", "TQ102"]
    for f in found:
        assert f.evidence["op_names"][0] == "aten::addmm"
        assert f.evidence["written_out"] and f.evidence["activation"] == "gelu"
        assert len(f.ops) == 9


def test_clip_quick_gelu_is_named_quick_gelu_not_silu() -> None:
    found = _findings(corpus_trace("clip"), "TQ102")
    assert len(found) == 4  # 2 layers x (text, vision)
    assert {f.evidence["activation"] for f in found} == {"quick_gelu"}
    assert not any("Replace the written-out" in f.fix for f in found)
    assert all("1.702" in f.fix for f in found)


def test_t5_gated_gelu_is_found_in_every_layer() -> None:
    """T5 v1.1's gated-gelu: `gelu_new` written out inside a GLU, 2 encoder + 2 decoder
    layers; the ET-based run finds the same four."""
    found = _findings(corpus_trace("t5"), "TQ103")
    assert len(found) == 4
    assert all(f.evidence.get("written_out", True) for f in found)
    assert _keys(found) == _keys(_exact_findings("t5", "TQ103"))


# -- the measurement -------------------------------------------------------------------------


MEASURED = {
    "bert": (67, 0, 68),
    "bert_ensemble": (135, 0, 139),
    "clip": (150, 2, 153),
    "convnext": (29, 0, 29),
    "ddp_train": (62, 1, 68),
    "dit": (410, 1, 460),
    "gemma": (190, 0, 190),
    "gpt2": (118, 0, 118),
    "gpt2_generate": (578, 3, 612),
    "inplace": (8, 0, 8),
    "llama": (179, 0, 179),
    "llama_compiled": (0, 4, 1),
    "llama_generate": (829, 4, 856),
    "llama_mha": (179, 0, 179),
    "mistral": (189, 0, 191),
    "mixtral": (249, 4, 257),
    "mlp_compiled": (0, 1, 1),
    "qwen2": (179, 0, 179),
    "qwen3": (215, 0, 215),
    "resnet": (22, 0, 22),
    "shared_block": (12, 0, 12),
    "t5": (402, 1, 411),
    "unet": (495, 2, 552),
    "vit": (64, 0, 64),
    "vit_repeated": (192, 0, 192),
    "whisper": (239, 0, 240),
}
"""The 26 entries of issue 10's rounds, each as measured (edges right, wrong, exact):
5,190 right of 5,213 inferred, 5,396 exact (precision 0.996, recall 0.962); `ddp_train`
60 right before `readers/saved_operands.py`, 62 with it (5,192 of 5,215)."""
KINDS = {
    "eager attention": (
        ("bert_eager", "vit_eager", "clip_eager", "gpt2_eager", "llama_eager"),
        (0.975, 0.955),
    ),
    "tensor-parallel block": (("tp_block",), (0.975, 0.975)),
    "training step": (("gpt2_train_ce", "cnn_train", "tp_train"), (0.95, 0.925)),
}
"""Kinds added after them, with the edge precision and recall each holds over its entries
(micro-averaged): eager attention 0.951 / 0.933 before `readers/attention_operands.py`,
0.980 / 0.962 with it; the tensor-parallel block 0.932 / 0.872 before
`readers/bias_gelu.py`, 0.979 / 0.979 with it; the training steps 0.955 / 0.930 (708 of 741
right, 761 exact; 0.953 / 0.928 before `readers/softmax_backward.py` and layers chained
across calls; 0.926 / 0.903 before `readers/parameter_order.py` and
`readers/saved_inputs.py`, 0.860 / 0.732 before `readers/foreach_adam.py`,
`readers/saved_operands.py` and `readers/bias_gelu_backward.py`, 0.775 / 0.704 before
`readers/optimizer_steps.py` and `readers/bias_gelu.py`, 0.752 / 0.666 before the backward
ops' several gradients were read)."""
TARGET = (0.95, 0.90)
"""What each kind is to reach (the issue "Data flow on real GPU work")."""


def _edge_counts(name: str) -> tuple[int, int, int]:
    """(right, wrong, exact) edges of one corpus entry, as `dataflow_accuracy` counts them."""
    from dataflow_accuracy import edge_sets

    inferred, exact = edge_sets(corpus_trace(name), corpus_et(name))
    return len(inferred & exact), len(inferred - exact), len(exact)


def _kind_accuracy(names: tuple[str, ...]) -> tuple[float, float]:
    right, wrong, exact = (sum(c) for c in zip(*(_edge_counts(n) for n in names), strict=True))
    return right / (right + wrong), right / exact


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_old_entries_hold_their_measured_edges(name: str) -> None:
    """Each of the 26 entries keeps its measured right edges and makes no more wrong ones."""
    corpus_paths(name)
    right, wrong, exact = _edge_counts(name)
    was_right, was_wrong, was_exact = MEASURED[name]
    assert exact == was_exact
    assert right >= was_right
    assert wrong <= was_wrong


def test_old_entries_keep_their_findings() -> None:
    """The fusion rules on inferred data flow make the ET run's findings over the 26
    (precision 1.000, recall 1.000 as measured)."""
    from dataflow_accuracy import Score, pairs, score

    entries = [entry for entry in pairs(CORPUS) if entry[0] in MEASURED]
    if len(entries) < len(MEASURED):
        pytest.skip("the corpus is not recorded")
    total = Score("old")
    for entry in entries:
        total.add(score(*entry)[0])
    row = total.row()
    assert row["finding_precision"] == 1.0
    assert row["finding_recall"] >= 0.995


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_reaches_its_target(kind: str) -> None:
    names, (precision, recall) = KINDS[kind]
    for name in names:
        corpus_paths(name)
    got = _kind_accuracy(names)
    assert got[0] >= max(precision, TARGET[0]) and got[1] >= max(recall, TARGET[1]), got


# -- class 4: most-recent same-shape sibling ----------------------------------------------


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral", "gemma", "mixtral"])
def test_rotary_cos_and_sin_read_the_same_embedding(name: str) -> None:
    """RotaryEmbedding: `emb.cos() * s; emb.sin() * s` are two expressions of one angle
    (the ET: cat -> cos, cat -> sin), no 4-op TQ104 chain `cos -> mul -> sin -> mul`."""
    trace = corpus_trace(name)
    exact = _pairs(tensor_edges(trace, corpus_et(name), trace.dataflow_ops))
    ops = trace.dataflow_ops.select("event", "name")
    sines = ops.filter(pl.col("name") == "aten::sin")["event"]
    into_sin = _pairs(trace.dataflow.filter(pl.col("consumer").is_in(sines.implode())))
    assert into_sin and into_sin <= exact
    chains = _findings(trace, "TQ104")
    names = dict(ops.iter_rows())
    assert not [f for f in chains if {"aten::sin", "aten::cos"} <= {names[e] for e in f.ops}]


def _exact_reads(name: str) -> tuple[pl.DataFrame, dict[int, str]]:
    trace = corpus_trace(name)
    exact = tensor_edges(trace, corpus_et(name), trace.dataflow_ops)
    return exact, dict(trace.dataflow_ops.select("event", "name").iter_rows())


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral", "gemma", "mixtral"])
def test_rotary_sum_reads_no_replaced_value(name: str) -> None:
    """`q * cos + rotate_half(q) * sin`: the ET's add reads the two muls. `q * cos` looks
    replaced by the slices of `rotate_half`, so once the add read `rotate_half`'s `cat`
    (a hidden value); a hidden value is taken by no one now."""
    exact, names = _exact_reads(name)
    sums = (
        exact.group_by("consumer")
        .agg(pl.col("producer_name").sort())
        .filter(pl.col("producer_name") == ["aten::mul", "aten::mul"])["consumer"]
    )
    sums = sums.filter(sums.replace_strict(names, return_dtype=pl.String) == "aten::add")
    assert sums.len() >= 4  # q and k in each of 2 layers
    inferred = _pairs(corpus_trace(name).dataflow.filter(pl.col("consumer").is_in(sums.implode())))
    assert inferred and inferred <= _pairs(exact)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral", "gemma", "mixtral"])
def test_rotary_k_times_cos_reads_k_not_v(name: str) -> None:
    """`k, v` are made one after the other and both unread when `k * cos` runs: the most
    recent value of k's shape is `v`, and `k * cos` was read as `v * cos`. Unread values of
    one module call are read oldest first (`matching._queued`)."""
    exact, _ = _exact_reads(name)
    rotary = exact.filter(
        (pl.col("producer_name") == "aten::transpose") & (pl.col("consumer_name") == "aten::mul")
    )["consumer"]
    assert rotary.n_unique() >= 4  # q * cos and k * cos in each of 2 layers
    inferred = corpus_trace(name).dataflow.filter(
        pl.col("consumer").is_in(rotary.implode()) & (pl.col("producer_name") == "aten::transpose")
    )
    assert _pairs(inferred) and _pairs(inferred) <= _pairs(exact)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral", "gemma", "mixtral"])
def test_rotate_half_slices_read_x_not_x_times_cos(name: str) -> None:
    """`x * cos + rotate_half(x) * sin`: rotate_half's slices read `x` (the ET), though
    `x * cos` is the most recent value of that shape when they run."""
    exact, _ = _exact_reads(name)
    slices = exact.filter(
        (pl.col("consumer_name") == "aten::slice") & (pl.col("producer_name") == "aten::transpose")
    )["consumer"]
    assert slices.n_unique() >= 8  # two per rotate_half, q and k, 2 layers
    inferred = _pairs(
        corpus_trace(name).dataflow.filter(pl.col("consumer").is_in(slices.implode()))
    )
    assert inferred == _pairs(exact.filter(pl.col("consumer").is_in(slices.implode())))


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral", "gemma", "mixtral"])
def test_rotary_pointwise_chains_are_the_et_ones(name: str) -> None:
    """Per q and k, the ET's TQ104 chain `mul -> mul -> add` of the rotary embedding is
    found: 4 of each model's 10 findings were missed while a slice "replaced" `x * cos`
    (a slice takes part of a value, it does not replace it)."""
    got, truth = _findings(corpus_trace(name), "TQ104"), _exact_findings(name, "TQ104")
    assert len(truth) >= 4
    assert _keys(got) == _keys(truth)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral", "gemma", "mixtral"])
def test_twin_ops_read_twin_values_in_order(name: str) -> None:
    """`return cos.to(dtype), sin.to(dtype)`, then `cos.unsqueeze(1), sin.unsqueeze(1)`:
    both `to`s (and both unsqueezes) were given `sin * s`, the most recent value of the
    shape; the ET has the first read `cos * s` (`matching.twin_reads`)."""
    exact, _ = _exact_reads(name)
    twins = exact.filter(
        pl.col("consumer_name").is_in(["aten::unsqueeze", "aten::to"])
        & (pl.col("producer_name") == "aten::mul")
    )["consumer"]
    assert twins.n_unique() >= 4  # two `to`s, then two unsqueezes per layer
    inferred = corpus_trace(name).dataflow.filter(pl.col("consumer").is_in(twins.implode()))
    assert _pairs(inferred) == _pairs(exact.filter(pl.col("consumer").is_in(twins.implode())))


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral", "gemma", "mixtral"])
def test_rotary_muls_read_cos_and_sin_alternately(name: str) -> None:
    """`q * cos`, `rotate_half(q) * sin`, `k * cos`, `rotate_half(k) * sin`: all four were
    given `sin`, the most recent value of the shape, and `cos` went unread. The ET has them
    alternate, and so do the inferred edges now."""
    exact, _ = _exact_reads(name)
    factors = exact.filter(
        (pl.col("consumer_name") == "aten::mul") & (pl.col("producer_name") == "aten::unsqueeze")
    )
    assert factors.height >= 8  # 4 muls per layer
    into = pl.col("consumer").is_in(factors["consumer"].implode())
    inferred = corpus_trace(name).dataflow.filter(
        into & (pl.col("producer_name") == "aten::unsqueeze")
    )
    assert _pairs(inferred) == _pairs(factors)


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", "gpt2", "clip", "whisper"])
def test_pre_norm_residual_adds_read_the_norms_input(name: str) -> None:
    """`h = x + attn(norm(x))`: the residual add reads `x`; `norm(x)` is the more recent
    value of the shape and was read instead (`layer_norm -> add`, RMSNorm's `mul -> add`)."""
    trace = corpus_trace(name)
    exact, _ = _exact_reads(name)
    ops = trace.dataflow_ops
    shapes = pl.col("shapes")
    residual = ops.filter(
        (pl.col("name") == "aten::add")
        & (shapes.list.get(0, null_on_oob=True) == shapes.list.get(1, null_on_oob=True))
        & (shapes.list.get(0, null_on_oob=True).list.len() == 3)  # [batch, tokens, hidden]
    )["event"]
    into = pl.col("consumer").is_in(residual.implode())
    assert exact.filter(into).height >= 8  # 2 per layer, 2 layers (CLIP, Whisper: 2 towers)
    assert _pairs(trace.dataflow.filter(into)) <= _pairs(exact)


def test_type_as_returns_the_value_just_computed() -> None:
    """Gemma's RMSNorm ends in `output.type_as(x)`: `self` is the newer value, the
    argument the older; pairing them in program order read `x.type_as(output)`, so every
    projection after the norm read the norm's input (the ET: its result)."""
    trace = corpus_trace("gemma")
    exact, _ = _exact_reads("gemma")
    projections = trace.dataflow.filter(pl.col("consumer_name") == "aten::linear")
    assert projections.height >= 14  # q, k, v, o, gate, up, down per layer; the lm head
    assert _pairs(projections) <= _pairs(exact)


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_written_out_gelu_cubes_x_not_half_x(name: str) -> None:
    """`0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3)))`: the ET's `pow` reads `x` and the
    last `mul` reads `0.5 * x`; by shape and order they read the other one."""
    trace = corpus_trace(name)
    exact, _ = _exact_reads(name)
    into_pow = trace.dataflow.filter(pl.col("consumer_name") == "aten::pow")
    assert into_pow.height >= 2  # one GELU per layer (and T5's RMSNorm squares)
    assert _pairs(into_pow) <= _pairs(exact)
    gelu = trace.dataflow.filter(pl.col("evidence").str.contains("scaled-term"))
    cubes = gelu.filter(pl.col("consumer_name") == "aten::pow").height
    assert cubes >= 2 and gelu.height == 2 * cubes  # the pow and the last mul of each
    assert _pairs(gelu) <= _pairs(exact)


def test_quick_gelu_keeps_its_reads() -> None:
    """QuickGELU, `x * sigmoid(1.702 * x)`, starts with a scalar multiple too, but reads `x`
    nowhere in between: its sigmoid reads `1.702 * x`, as the ET has it."""
    trace = corpus_trace("clip")
    exact, _ = _exact_reads("clip")
    into_sigmoid = trace.dataflow.filter(pl.col("consumer_name") == "aten::sigmoid")
    assert into_sigmoid.height >= 4
    assert _pairs(into_sigmoid) <= _pairs(exact)


@pytest.mark.parametrize("name", ["bert", "bert_ensemble"])
def test_bert_embeddings_read_position_ids_and_their_gather(name: str) -> None:
    """`position_ids[:, :T]`, `gather(token_type_buffer, 1, position_ids)`, `.expand(B, T)`:
    the expand read the slice (the gather had no output shape) and, once it had one, the
    position embedding lost the slice (the gather "replaced" it; taking part of a value,
    like a slice, replaces nothing)."""
    trace = corpus_trace(name)
    exact, _ = _exact_reads(name)
    embeddings = trace.dataflow.join(
        trace.dataflow_ops.select(pl.col("event").alias("consumer"), "module"), on="consumer"
    ).filter(pl.col("module").str.contains("BertEmbeddings_", literal=True))
    got = _pairs(embeddings) & _pairs(exact)
    assert len(got) >= 6 * (1 + (name == "bert_ensemble"))
    names = dict(trace.dataflow_ops.select("event", "name").iter_rows())
    assert {(names[p], names[c]) for p, c in got} >= {
        ("aten::gather", "aten::expand"),
        ("aten::slice", "aten::embedding"),
    }


# -- generate's host-side bookkeeping (outside any module call) -----------------------------


@pytest.mark.parametrize("name", ["gpt2_generate", "llama_generate"])
def test_stopping_criteria_any_reads_isin(name: str) -> None:
    """`EosTokenCriteria`: `isin(input_ids[:, -1], eos).any(-1)`-style checks. `isin` has
    its elements' shape; with no known output it was skipped and `any` read the slice
    before it (the ET: isin -> any, every step)."""
    trace = corpus_trace(name)
    exact = tensor_edges(trace, corpus_et(name), trace.dataflow_ops)
    into_any = exact.filter(
        (pl.col("consumer_name") == "aten::any") & (pl.col("producer_name") == "aten::isin")
    )
    assert into_any.height >= 4  # one per generated token
    inferred = trace.dataflow.filter(pl.col("consumer").is_in(into_any["consumer"].implode()))
    assert _pairs(inferred) == _pairs(into_any)


BOOL_OPS = ("aten::eq", "aten::lt", "aten::gt", "aten::isin", "aten::any", "aten::bitwise_not")


def _reads_bool(trace: traceq.Trace, edges: pl.DataFrame) -> pl.Series:
    """Per edge: the consumer's recorded type at that input is `bool`."""
    types = trace.dataflow_ops.select(pl.col("event").alias("consumer"), "input_types")
    return edges.join(types, on="consumer", how="left", maintain_order="left").select(
        pl.col("input_types").list.get(pl.col("input_index"), null_on_oob=True) == "bool"
    )["input_types"]


@pytest.mark.parametrize("name", ["gpt2_generate", "llama_generate", "t5"])
def test_a_bool_value_is_read_only_as_a_bool(name: str) -> None:
    """A comparison's (`any`'s, `isin`'s) result is a bool tensor, and the profiler records
    each argument's own dtype: the ET's edges out of such ops all go into arguments typed
    `bool`. Inferred ones once gave them to long arguments of one shape (`unfinished &
    ~done` reading `any(...)`, T5's bucket `where` reading a `lt`)."""
    trace = corpus_trace(name)
    exact = tensor_edges(trace, corpus_et(name), trace.dataflow_ops).filter(
        pl.col("producer_name").is_in(BOOL_OPS) & pl.col("input_index").is_not_null()
    )
    assert exact.height >= 3
    assert _reads_bool(trace, exact).all()  # the premise, from the recorded run
    inferred = trace.dataflow.filter(
        pl.col("producer_name").is_in(BOOL_OPS) & pl.col("input_index").is_not_null()
    )
    assert inferred.height > 0
    assert _reads_bool(trace, inferred).all()
    assert _pairs(inferred) <= _pairs(tensor_edges(trace, corpus_et(name), trace.dataflow_ops))


@pytest.mark.parametrize("name", ["clip", "dit", "unet"])
def test_sibling_projections_are_viewed_in_order(name: str) -> None:
    """`q = self.q_proj(x); k = self.k_proj(x); v = self.v_proj(x)`, then `q.view(...)`,
    `k.view(...)`, `v.view(...)` (CLIP's and diffusers' attention): the ET's views read the
    projections in order; by shape the first view took `v`, the most recent value."""
    trace = corpus_trace(name)
    exact = tensor_edges(trace, corpus_et(name), trace.dataflow_ops)
    views = exact.filter(
        (pl.col("producer_name") == "aten::linear") & (pl.col("consumer_name") == "aten::view")
    )
    assert views.height >= 6
    inferred = trace.dataflow.filter(
        pl.col("consumer").is_in(views["consumer"].implode())
        & (pl.col("producer_name") == "aten::linear")
    )
    assert _pairs(inferred) == _pairs(views)


@pytest.mark.parametrize("name", ["gpt2_generate", "llama_generate"])
def test_a_bool_factory_is_read_only_as_a_bool(name: str) -> None:
    """`torch.full((batch,), False, dtype=torch.bool)` (`generate`'s finished flags) makes
    a bool tensor: the ET reads it only at bool arguments, and so must the inferred edges
    (they gave it to the long `unfinished` of `unfinished & ~done` and to the long `add`
    of the next tokens, 14 wrong edges)."""
    trace = corpus_trace(name)
    fulls = trace.dataflow.filter(pl.col("producer_name") == "aten::full")
    exact = tensor_edges(trace, corpus_et(name), trace.dataflow_ops).filter(
        pl.col("producer_name") == "aten::full"
    )
    assert exact.height >= 4 and _reads_bool(trace, exact).all()
    assert fulls.height >= 4
    assert _pairs(fulls) <= _pairs(exact)
