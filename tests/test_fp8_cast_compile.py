"""torchao float8 tensorwise casts under torch.compile (issue 19): the amax reduction fuses into the producing
kernel, so the compiled stack pays 4 B per element per cast (read 16-bit, write fp8 and its transpose) and the
eager one 6 B (plus a separate amax read); the float8 development rows ran compiled."""

from tpsim.estimator.stackterms import stack_terms
from tpsim.stacks import load_stack


def test_compiled_float8_casts_skip_the_amax_read():
    assert stack_terms(load_stack("torchtitan-compile")).fp8_cast_bytes == (4.0, 4.0)
    assert stack_terms(load_stack("torchtitan")).fp8_cast_bytes == (6.0, 6.0)


def test_float8_fsdp_gathers_fp8_weights():
    """torchtitan's float8 recipe (docs/float8.md: enable_fsdp_float8_all_gather): the ZeRO-3 weight gathers move
    1 B per parameter with fp8 GEMMs, bf16 otherwise; Megatron's distributed optimizer gathers bf16."""
    for name in ("torchtitan", "torchtitan-compile"):
        terms = stack_terms(load_stack(name))
        assert terms.state_bytes("fp8").wire_params == 1.0 and terms.state_bytes("bf16").wire_params == 2.0
    assert stack_terms(load_stack("megatron")).state_bytes("fp8").wire_params == 2.0
