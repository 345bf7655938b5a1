"""Data flow into tensor-list arguments (`cat`, `stack`, ...) against the Execution Trace corpus.

Kineto records a `TensorList` argument as one entry of nested shapes (`Input Dims`
`[[[2, 4, 12, 8], [2, 4, 12, 8]], []]`); each tensor of it is a data input of its own.
The exact producers here are recomputed from the raw ET JSON by this file alone (tensor
ids in, tensor ids out, the ET's own op tree and `rf_id`), not through
`traceq.relations.dataflow.execution_trace`, so the tests check inferred edges against what the
observer recorded. Before list inputs were matched, no op had an edge into a `cat`.
"""

from __future__ import annotations

import gzip
import json
import re
from functools import cache

import polars as pl
import pytest
from conftest import CORPUS, corpus_paths, corpus_trace
from test_dataflow_corpus import MEASURED as FIRST_ENTRIES

from traceq.relations.dataflow import shapes

DISPATCHER_OP = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*(\.\w+)?$")
NOT_OPS = ("autograd::", "profiler::", "torch::")
ENTRIES = sorted(
    p.name.removesuffix(".et.json.gz")
    for p in CORPUS.glob("*.et.json.gz")
    if p.name.removesuffix(".et.json.gz") in FIRST_ENTRIES
)
"""The 26 entries these counts were measured on (later kinds: test_dataflow_corpus.py)."""


def _tensor_keys(values: dict) -> list[tuple[int, int]]:
    """(tensor id, storage id) of each tensor among an ET node's `inputs` or `outputs`
    (a tensor value is `[id, storage, offset, numel, itemsize, device]`), lists included."""
    keys = []
    for value, kind in zip(values["values"], values["types"], strict=False):
        if kind.startswith("Tensor") and value:
            keys.append((value[0], value[1]))
        elif kind.startswith("GenericList[Tensor"):
            keys.extend((item[0], item[1]) for item in value if item)
    return keys


@cache
def _et_list_reads(name: str) -> dict[int, list[tuple[int | None, list[int]]]]:
    """For each list op of the ET (`GenericList[Tensor...]` input), by its trace event: the
    (element shape, producer event) of each tensor of the list, in list order. The
    producer is the outermost dispatcher op enclosing the last ET node that wrote the
    tensor before the list op (None: written before the trace, e.g. a parameter)."""
    doc = json.loads(gzip.decompress(corpus_paths(name)[1].read_bytes()))
    nodes = sorted(doc["nodes"], key=lambda n: n["id"])
    by_id = {n["id"]: n for n in nodes}
    trace = corpus_trace(name)
    events = {
        (rf, op): event
        for rf, op, event in trace.ops.select("record_function_id", "name", "event").iter_rows()
        if rf is not None
    }

    def attrs(node: dict) -> dict:
        return {a["name"]: a["value"] for a in node.get("attrs", ())}

    def root(node_id: int) -> int | None:
        outer, seen = None, set()
        while node_id in by_id and node_id not in seen:  # the ET's root is its own parent
            seen.add(node_id)
            op = by_id[node_id]["name"]
            if DISPATCHER_OP.match(op) and not op.startswith(NOT_OPS):
                outer = node_id
            node_id = by_id[node_id].get("ctrl_deps")
        return outer

    def event(node_id: int | None) -> int | None:
        if node_id is None:
            return None
        node = by_id[node_id]
        return events.get((attrs(node).get("rf_id"), node["name"]))

    writer: dict[tuple[int, int], int] = {}
    reads: dict[int, list[tuple[int | None, list[int]]]] = {}
    for node in nodes:
        inputs = node["inputs"]
        for value, kind, shape in zip(
            inputs["values"], inputs["types"], inputs["shapes"], strict=False
        ):
            if kind.startswith("GenericList[Tensor") and root(node["id"]) == node["id"]:
                consumer = event(node["id"])
                if consumer is not None:
                    reads[consumer] = [
                        (event(root(writer[key])) if key in writer else None, element)
                        for key, element in zip(
                            [(item[0], item[1]) for item in value], shape, strict=True
                        )
                    ]
        read = set(_tensor_keys(inputs))
        mutating = "!" in str(attrs(node).get("op_schema", "")) or node["name"].endswith("_")
        for key in _tensor_keys(node["outputs"]):
            if mutating or key not in read:  # an op returning its input wrote nothing
                writer[key] = node["id"]
    return reads


def _list_arguments(name: str) -> pl.DataFrame:
    """`consumer`, `input_index`: the ops the ET describes with a list argument Kineto
    records as a `TensorList` (`cat`, `stack`, `einsum`; not `index`'s `Tensor?[]`), and
    the argument's position."""
    ops = corpus_trace(name).dataflow_ops.filter(
        pl.col("event").is_in(pl.Series(list(_et_list_reads(name)), dtype=pl.Int64).implode())
    )
    return (
        ops.select(
            pl.col("event").alias("consumer"),
            pl.col("input_types").list.eval(pl.arg_where(pl.element() == "TensorList")),
        )
        .explode("input_types")
        .drop_nulls()
        .select("consumer", pl.col("input_types").cast(pl.Int64).alias("input_index"))
    )


def _into_lists(name: str) -> pl.DataFrame:
    """Inferred edges into the tensors of those list arguments."""
    return corpus_trace(name).dataflow.join(
        _list_arguments(name), on=["consumer", "input_index"], how="semi"
    )


def _exact(name: str) -> set[tuple[int, int]]:
    return {
        (producer, consumer)
        for consumer, elements in _et_list_reads(name).items()
        if consumer in set(_list_arguments(name)["consumer"])
        for producer, _ in elements
        if producer is not None and producer != consumer
    }


@pytest.mark.parametrize("name", ENTRIES)
def test_every_edge_into_a_tensor_list_is_one_the_et_recorded(name: str) -> None:
    inferred = set(_into_lists(name).select("producer", "consumer").iter_rows())
    wrong = inferred - _exact(name)
    assert not wrong, f"{len(wrong)} of {len(inferred)} edges into list ops not in the ET"


def test_list_edges_recover_most_of_the_corpus_list_reads() -> None:
    """Summed over the corpus: 343 of the 354 edges into list ops are inferred (none
    before; 270 of 337 before `llama_mha`, whose 17 are all found; 287 before a KV
    cache's past and `generate`'s growing tensors were read as carried by the loop
    (`loop_carried`) and GPT-2's cache as split from one GEMM). The rest: UNet skip
    connections made long before (8), the first step's position ids made before the
    loop (2), one in `ddp_train`."""
    found = exact = 0
    for name in ENTRIES:
        truth = _exact(name)
        found += len(truth & set(_into_lists(name).select("producer", "consumer").iter_rows()))
        exact += len(truth)
    assert exact == 354
    assert found >= 343


def _names(name: str, events: set[int | None]) -> set[str]:
    ops = corpus_trace(name).dataflow_ops
    return set(ops.filter(pl.col("event").is_in(list(events)))["name"])


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma", "mixtral", "llama_generate"])
def test_rotate_half_cat_reads_its_neg_and_its_slice(name: str) -> None:
    """`cat((-x[..., h:], x[..., :h]))`: two equal-shaped pieces, both found."""
    rotations = {
        consumer: {p for p, _ in elements}
        for consumer, elements in _et_list_reads(name).items()
        if _names(name, {p for p, _ in elements}) == {"aten::neg", "aten::slice"}
    }
    assert len(rotations) >= 4  # q and k in each of 2 layers
    edges = _into_lists(name)
    for consumer, producers in rotations.items():
        got = set(edges.filter(pl.col("consumer") == consumer)["producer"])
        assert got == producers


@pytest.mark.parametrize("name", ["dit", "unet"])
def test_sinusoidal_embedding_cat_reads_sin_and_cos(name: str) -> None:
    """`cat([sin(e), cos(e)])` (diffusers' timestep embedding): the cos was read as reading
    the sin and "replaced" it, so the cat found only the cos."""
    trig = {
        consumer: [p for p, _ in elements]
        for consumer, elements in _et_list_reads(name).items()
        if _names(name, {p for p, _ in elements}) == {"aten::sin", "aten::cos"}
    }
    assert trig
    edges = _into_lists(name)
    for consumer, producers in trig.items():
        assert set(edges.filter(pl.col("consumer") == consumer)["producer"]) == set(producers)


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma", "t5", "whisper", "llama_generate"])
def test_kv_cache_update_reads_keys_then_values(name: str) -> None:
    """`keys = cat([keys, k]); values = cat([values, v])` on a first step (empty caches,
    `torch.tensor([])`): keys read `k` (after its rotary embedding) and the first empty
    cache, values `v` and the second, as the ET has it. Shape and order gave the values
    cat `k` and both the second empty cache (twin list ops now get no pieces from
    `matching`; `kv_cache` reads them)."""
    ops = corpus_trace(name).dataflow_ops
    empties = set(ops.filter(pl.col("output_shape") == [0])["event"])
    updates = {
        consumer: {p for p, _ in elements}
        for consumer, elements in _et_list_reads(name).items()
        if any(p in empties for p, _ in elements)
    }
    assert len(updates) >= 4  # keys and values of 2 layers
    edges = _into_lists(name)
    for consumer, producers in updates.items():
        assert set(edges.filter(pl.col("consumer") == consumer)["producer"]) == producers


@pytest.mark.parametrize("name", ["llama", "dit", "unet", "gpt2_generate"])
def test_list_edges_are_numbered_by_argument_as_the_et_numbers_them(name: str) -> None:
    """Each tensor of a list comes in at the list's argument index (`cat`'s 0, `einsum`'s
    1), as `execution_trace.tensor_edges` numbers them, so inferred and exact edges
    compare; the order within the list is the list's (`shapes.list_elements`)."""
    from traceq.relations.dataflow.execution_trace import load_execution_trace, tensor_edges

    lists = _list_arguments(name)
    into = corpus_trace(name).dataflow.join(lists.select("consumer"), on="consumer", how="semi")
    assert into.height and set(into["input_index"]) <= set(lists["input_index"])
    exact = tensor_edges(corpus_trace(name), load_execution_trace(corpus_paths(name)[1]))
    exact = exact.join(lists.select("consumer"), on="consumer", how="semi")
    assert set(exact["input_index"]) == set(lists["input_index"])


@pytest.mark.parametrize("name", ["llama", "unet", "llama_generate"])
def test_cat_output_shape_is_the_one_the_et_recorded(name: str) -> None:
    doc = json.loads(gzip.decompress(corpus_paths(name)[1].read_bytes()))
    recorded = {
        {a["name"]: a["value"] for a in n["attrs"]}["rf_id"]: n["outputs"]["shapes"][0]
        for n in doc["nodes"]
        if n["name"] == "aten::cat"
    }
    ops = corpus_trace(name).dataflow_ops.join(
        corpus_trace(name).ops.select(pl.col("event").cast(pl.Int64), "record_function_id"),
        on="event",
    )
    cats = ops.filter(pl.col("name") == "aten::cat")
    assert cats.height
    for rf, shape in cats.select("record_function_id", "output_shape").iter_rows():
        assert shape == recorded[rf]


def test_each_tensor_of_a_list_is_a_data_input_at_the_lists_index() -> None:
    """Kineto's nested `Input Dims`; an empty tensor (a KV cache's first step) counts."""
    sig = shapes.signature(
        "aten::cat", "[[[0], [2, 2, 12, 16]], []]", ["TensorList", "Scalar"], ["", "-2"]
    )
    assert sig.inputs == [(0, [0]), (0, [2, 2, 12, 16])]
    assert sig.output == [2, 2, 12, 16]
    stack = shapes.signature(
        "aten::stack", "[[[2, 8], [2, 8], [2, 8]], []]", ["TensorList", "Scalar"], ["", "0"]
    )
    assert stack.inputs == [(0, [2, 8])] * 3
    assert stack.output == [3, 2, 8]
