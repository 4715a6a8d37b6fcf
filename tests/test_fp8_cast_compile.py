"""torchao float8 tensorwise casts (issue 19, torchao matmul_with_hp_or_float8_args): forward casts the input,
backward casts the output gradient twice and the saved 16-bit input again for the weight gradient. Under
torch.compile the amax reduction fuses into the producing kernel: 3 B per input element (read 2, write 1), 4 B per
output-gradient element (read 2, write 1 + 1), 3 B for the input again; eager, each cast call reads the tensor once
more for its amax: 5 / 10 / 5 B. The float8 development rows ran compiled."""

from tpsim.estimator.stackterms import stack_terms
from tpsim.stacks import load_stack


def test_compiled_float8_casts_skip_the_amax_read():
    assert stack_terms(load_stack("torchtitan-compile")).fp8_cast_bytes == (3.0, 4.0, 3.0)
    assert stack_terms(load_stack("torchtitan")).fp8_cast_bytes == (5.0, 10.0, 5.0)


def test_float8_fsdp_gathers_fp8_weights():
    """torchtitan's float8 recipe (docs/float8.md: enable_fsdp_float8_all_gather): the ZeRO-3 weight gathers move
    1 B per parameter with fp8 GEMMs, bf16 otherwise; Megatron's distributed optimizer gathers bf16."""
    for name in ("torchtitan", "torchtitan-compile"):
        terms = stack_terms(load_stack(name))
        assert terms.state_bytes("fp8").wire_params == 1.0 and terms.state_bytes("bf16").wire_params == 2.0
    assert stack_terms(load_stack("megatron")).state_bytes("fp8").wire_params == 2.0
