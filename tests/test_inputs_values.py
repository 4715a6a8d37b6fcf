"""Issue 26, values that mean nothing: refused with one line naming the field, never used as given (a
negative optimizer time was printed from a stack file with negative bytes per parameter)."""

import math

import pytest
import yaml

from tpsim.cli import main
from tpsim.errors import InputError
from tpsim.stacks import STACKS_DIR, load_stack


@pytest.mark.parametrize("value", ["", ",", "fp32,", " "])
def test_profile_empty_dtype_is_refused(value, capsys):
    assert main(["profile", "--dtype", value, "--quick"]) == 2
    assert "--dtype" in capsys.readouterr().err


@pytest.mark.parametrize("section, key, value, needle", [
    ("compute", "optimizer_bytes_per_param", -4, "optimizer_bytes_per_param.value=-4 must be > 0"),
    ("compute", "host_us_per_op", math.nan, "host_us_per_op.value=nan must be a finite number"),
    ("compute", "host_us_per_op", [1, 2], "host_us_per_op.value=[1, 2] must be a number"),
    ("memory", "allocator_reserve_fraction", 3.0, "allocator_reserve_fraction.value=3.0 is above"),
    ("comm", "ep_node_dedup", "yes", "ep_node_dedup.value='yes' must be true or false"),
])
def test_stack_figures_are_checked_before_use(tmp_path, section, key, value, needle):
    data = yaml.safe_load((STACKS_DIR / "megatron.yaml").read_text())
    data[section].setdefault(key, {"value": 0, "source": "test"})["value"] = value
    path = tmp_path / "bad-stack.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as info:
        load_stack(path)
    assert needle in str(info.value) and "bad-stack.yaml" in str(info.value)
