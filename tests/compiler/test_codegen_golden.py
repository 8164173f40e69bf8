"""The generated code of the README's MLP and of the attention example, for one device and for two,
is what the golden files under tests/golden/codegen/ hold: a change to lowering shows as a diff to
review. (SHAPESCRIPT_UPDATE_GOLDEN=1 rewrites them; a missing one fails.)"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from types import ModuleType

import pytest
from programs import GPT, GPT_FILE, README
from support import ROOT, assert_golden

from shapescript.api import compile_program
from shapescript.pipeline import python_module

GOLDEN = ROOT / "tests" / "golden" / "codegen"
DEVICES = {"cpu": "cpu", "cpu[0 1]": "cpu_0_1"}  # devices, and how the golden file's name spells them


def attention_dims() -> dict[str, int]:
    """The dims examples/attention/train.py loads gpt.ss with: its SMALL, and V, its corpus's characters."""
    spec = importlib.util.spec_from_file_location("attention_train", GPT_FILE.parent / "train.py")
    assert spec is not None and spec.loader is not None
    train: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = train
    spec.loader.exec_module(train)
    return {"V": len(set((GPT_FILE.parent / "corpus.txt").read_text())), **train.SMALL}


# name: (source, file name it is compiled as (relative: the module names it), dims replaced at load)
PROGRAMS = {"mlp": (README, "mlp.ss", None), "gpt": (GPT, "gpt.ss", attention_dims())}


def generated(name: str, devices: str) -> str:
    source, file, dims = PROGRAMS[name]
    with warnings.catch_warnings():  # the attention example's dims replace gpt.ss's on purpose
        warnings.filterwarnings("ignore", message=".*sizes given when loading replace", category=UserWarning)
        return python_module(compile_program(source, file, devices, dims))


@pytest.mark.parametrize("devices", list(DEVICES))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_generated_code_is_the_golden_files(name: str, devices: str) -> None:
    text = generated(name, devices)
    assert generated(name, devices) == text  # built again from scratch: nothing depends on ids or hashes
    assert str(ROOT) not in text and "/tmp" not in text  # nothing of where the tests run
    path = GOLDEN / f"{name}_{DEVICES[devices]}.py.txt"
    assert_golden(text, path)
    compile(path.read_text(), str(path), "exec")  # the golden file is Python
