"""``kind = "python"`` models without processes: the catalogue's checks, the web's
schema validation and binning, and the worker's handler loading and torch options."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from carpool.core.catalogue import BinSpec, ModelSpec, load_catalogue
from carpool.core.errors import ConfigError, InvalidInput
from carpool.core.input_limits import InputLimits
from carpool.intake import inputs
from web.openapi.schemas import input_schema

SCHEMA = {"type": "object", "required": ["values"], "additionalProperties": False,
          "properties": {"values": {"type": "array", "items": {"type": "number"},
                                    "maxItems": 100}}}
BINS = """
[[models.mine.bins]]
name = "short"
max_size = 8
max_batch = 4
max_wait_ms = 5
max_depth = 100
[[models.mine.bins]]
name = "long"
max_size = 100
max_batch = 4
max_wait_ms = 5
max_depth = 100
"""


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "catalogue.toml"
    path.write_text(textwrap.dedent(body) + BINS)
    return path


def mine(tmp_path: Path, extra: str = "", handler: str = "mine_handler:Mine") -> ModelSpec:
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    path = write(tmp_path, f"""
        [models.mine]
        kind = "python"
        handler = "{handler}"
        measure = "size"
        measure_field = "values"
        input_schema = "schema.json"
        {extra}
        """)
    return load_catalogue(path).get("mine")


# --- the catalogue -----------------------------------------------------------------


def test_python_model_reads_its_schema_file_relative_to_the_catalogue(tmp_path: Path) -> None:
    spec = mine(tmp_path)
    assert spec.handler == "mine_handler:Mine"
    assert spec.input_schema == SCHEMA


@pytest.mark.parametrize(("body", "says"), [
    ('kind = "python"\nmeasure = "bytes"\ninput_schema = {type = "object"}', "handler"),
    ('kind = "python"\nhandler = "m:C"\nmeasure = "bytes"', "input_schema"),
    ('kind = "python"\nhandler = "m:C"\nmeasure = "size"\ninput_schema = {type = "object"}',
     "measure_field"),
    ('kind = "python"\nhandler = "m:C"\nmeasure = "pixels"\ninput_schema = {type = "object"}',
     "measures one of"),
    ('kind = "synthetic"\nhandler = "m:C"\nmeasure = "size"', "kind = 'python'"),
])
def test_a_python_model_missing_what_it_needs_is_refused_naming_it(
        tmp_path: Path, body: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_catalogue(write(tmp_path, "[models.mine]\n" + body + "\n"))


# --- the web: schema and bin ----------------------------------------------------


def test_input_that_breaks_the_schema_is_refused_with_where(tmp_path: Path) -> None:
    spec = mine(tmp_path)
    with pytest.raises(InvalidInput, match=r"input\.values\[1\]"):
        inputs.prepare(spec, {"values": [1, "two"]}, InputLimits())
    with pytest.raises(InvalidInput, match="extra"):
        inputs.prepare(spec, {"values": [1], "extra": True}, InputLimits())


def test_input_lands_in_the_bin_its_measure_field_picks(tmp_path: Path) -> None:
    spec = mine(tmp_path)
    assert inputs.prepare(spec, {"values": [1.0] * 8}, InputLimits()).bin.name == "short"
    assert inputs.prepare(spec, {"values": [1.0] * 9}, InputLimits()).bin.name == "long"


def test_an_integer_measure_field_is_its_own_size_and_never_negative(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [models.mine]
        kind = "python"
        handler = "m:C"
        measure = "size"
        measure_field = "n"
        input_schema = {type = "object"}
        """)
    spec = load_catalogue(path).get("mine")
    assert inputs.prepare(spec, {"n": 50}, InputLimits()).bin.name == "long"
    with pytest.raises(InvalidInput, match=">= 0"):
        inputs.prepare(spec, {"n": -1}, InputLimits())
    with pytest.raises(InvalidInput, match="key 'n'"):
        inputs.prepare(spec, {"m": 1}, InputLimits())


def test_bytes_measure_bins_by_the_inputs_json_length(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [models.mine]
        kind = "python"
        handler = "m:C"
        measure = "bytes"
        input_schema = {type = "object"}
        """)
    spec = load_catalogue(path).get("mine")
    assert inputs.prepare(spec, {}, InputLimits()).bin.name == "short"  # "{}": 2 bytes
    assert inputs.prepare(spec, {"k": "x" * 20}, InputLimits()).bin.name == "long"


def test_openapi_input_schema_is_the_models_own_without_json_schema_keywords(
        tmp_path: Path) -> None:
    spec = mine(tmp_path)
    with_id = ModelSpec(**{**spec.__dict__,
                           "input_schema": {**SCHEMA, "$schema": "x", "$id": "y"}})
    assert input_schema(with_id) == SCHEMA


def test_web_refuses_to_start_with_an_invalid_schema(tmp_path: Path) -> None:
    from carpool.intake.custom import check_schema

    spec = mine(tmp_path)
    broken = ModelSpec(**{**spec.__dict__, "input_schema": {"type": "no-such-type"}})
    with pytest.raises(ConfigError, match="not a valid JSON Schema"):
        check_schema(broken)


# --- the worker: loading the handler, torch options ------------------------------------

torch = pytest.importorskip("torch")

HANDLER = '''
import torch

class Mine:
    def __init__(self, spec, context):
        self.spec, self.context = spec, context
        self.seen_dtype = None
    def load(self):
        torch.manual_seed(0)
        self.model = self.context.prepare(torch.nn.Conv2d(3, 4, 1))
    def preprocess(self, job_input):
        return torch.tensor(job_input["values"], dtype=torch.float32).view(3, 2, 2)
    def example(self, bin_spec):
        return torch.zeros(3, 2, 2)
    def collate(self, items, bin_spec):
        return torch.stack(list(items))
    def forward(self, batch):
        self.seen_layout = batch.is_contiguous(memory_format=torch.channels_last)
        out = self.model(batch)
        self.seen_dtype = out.dtype
        return out.float()
    def postprocess(self, output, n):
        return [row.flatten().tolist() for row in output]
'''


@pytest.fixture
def handler_module(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "mine_handler.py").write_text(HANDLER)
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("mine_handler", None)


def run(spec: ModelSpec) -> tuple[Any, list[Any]]:
    from worker.handlers.python import PythonModel
    from worker.handlers.tuning import HandlerContext

    model = PythonModel(spec, HandlerContext.of(spec, "cpu"))
    model.load()
    bin_spec: BinSpec = spec.bins[0]
    items = [model.preprocess({"values": [i / 4 for i in range(12)]}),
             model.preprocess({"values": [1 - i / 8 for i in range(12)]})]
    with torch.inference_mode():
        results = model.postprocess(model.forward(model.collate(items, bin_spec)), 2)
    assert len(results) == 2
    return model.handler, [v for row in results for v in row]


def test_user_handler_runs_in_fp32_by_default(handler_module: Path) -> None:
    handler, results = run(mine(handler_module))
    assert handler.seen_dtype == torch.float32
    assert not handler.seen_layout
    assert len(results) == 2 * 4 * 2 * 2  # two items of 4 channels, 2 x 2


def test_bf16_option_runs_the_forward_pass_under_autocast(handler_module: Path) -> None:
    _, fp32 = run(mine(handler_module))
    handler, bf16 = run(mine(handler_module, '[models.mine.options]\ndtype = "bf16"'))
    assert handler.seen_dtype == torch.bfloat16
    assert bf16 == pytest.approx(fp32, abs=0.05)


def test_channels_last_option_hands_the_model_nhwc_batches(handler_module: Path) -> None:
    handler, _ = run(mine(handler_module, "[models.mine.options]\nchannels_last = true"))
    assert handler.seen_layout
    assert handler.model.weight.is_contiguous(memory_format=torch.channels_last)


def test_compile_option_wraps_the_module_in_torch_compile(handler_module: Path) -> None:
    _, eager = run(mine(handler_module))
    handler, compiled = run(mine(handler_module, '[models.mine.options]\ncompile = "eager"'))
    assert isinstance(handler.model, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled == pytest.approx(eager)


@pytest.mark.parametrize(("options", "says"), [
    ('dtype = "fp8"', "options.dtype"), ('channels_last = "yes"', "channels_last"),
    ("compile = 3", "options.compile")])
def test_a_bad_torch_option_stops_the_worker_at_start(
        handler_module: Path, options: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        run(mine(handler_module, f"[models.mine.options]\n{options}"))


@pytest.mark.parametrize(("handler", "says"), [
    ("no_such_package_xyz:Mine", "cannot import"), ("mine_handler:Nope", "no class"),
    ("json:JSONDecoder", "lacks load, preprocess, example, collate, forward, postprocess")])
def test_a_handler_that_cannot_be_used_is_a_start_up_error(
        handler_module: Path, handler: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        run(mine(handler_module, handler=handler))


def test_tensor_example_serves_a_torchscript_file_as_it_does_an_exported_one(
        tmp_path: Path) -> None:
    import subprocess

    from worker.handlers.python import PythonModel
    from worker.handlers.tuning import HandlerContext

    examples = Path(__file__).resolve().parent.parent.parent / "examples" / "tensor_model"
    outputs = []
    for name in ("mlp.pt", "mlp.pt2"):
        subprocess.run([sys.executable, str(examples / "make_weights.py"), str(tmp_path / name)],
                       check=True, capture_output=True, timeout=300)
        spec = ModelSpec("tensor", "python", "bytes", (BinSpec("all", 4096, 8, 5, 100),),
                         options={"weights": str(tmp_path / name), "shape": [16]},
                         handler="tensor_model:TensorModel", input_schema={"type": "object"})
        sys.path.insert(0, str(examples))
        try:
            model = PythonModel(spec, HandlerContext.of(spec, "cpu"))
            model.load()
        finally:
            sys.path.remove(str(examples))
            sys.modules.pop("tensor_model", None)
        items = [model.preprocess({"tensor": [i / 16 for i in range(16)]})]
        with torch.inference_mode():
            outputs.append(model.postprocess(model.forward(model.collate(items, spec.bins[0])),
                                             1))
        with pytest.raises(InvalidInput, match="shape"):
            model.preprocess({"tensor": [1.0, 2.0]})
    assert outputs[0] == outputs[1]
