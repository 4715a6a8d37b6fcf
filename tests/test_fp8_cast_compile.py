"""torchao float8 tensorwise casts under torch.compile (issue 19): the amax reduction fuses into the producing
kernel, so the compiled stack pays 4 B per element per cast (read 16-bit, write fp8 and its transpose) and the
eager one 6 B (plus a separate amax read); the float8 development rows ran compiled."""

from tpsim.estimator.stackterms import stack_terms
from tpsim.stacks import load_stack


def test_compiled_float8_casts_skip_the_amax_read():
    assert stack_terms(load_stack("torchtitan-compile")).fp8_cast_bytes == (4.0, 4.0)
    assert stack_terms(load_stack("torchtitan")).fp8_cast_bytes == (6.0, 6.0)
