"""benchmarks/peer/zoo_kernels.py's candidates: their names, the op counts of a compiled step, bytes against XLA's.

The compiles themselves (the GPU compiler's program, per layer kind and direction) are
tests/trainer/plan/test_hlo_kernels.py's (target tier); these read text and rows, in milliseconds.
"""

import pytest

from tests import files


def load(name: str):
    return files.load_script("benchmarks", "peer", f"{name}.py", with_its_folder=True)


# An optimized GPU HLO's shape, cut down: a cuDNN forward and weight gradient, a Triton GEMM fusion whose inside
# holds a dot over a concatenate (an im2col), a transpose, converts, an all-gather.
HLO = '''
%gemm_computation (p0: bf16[64,27], p1: bf16[27,8]) -> bf16[64,8] {
  %p0 = bf16[64,27]{1,0} parameter(0)
  %cat = bf16[64,27]{1,0} concatenate(%p0, %p0), dimensions={1}
  %p1 = bf16[27,8]{1,0} parameter(1)
  ROOT %dot.1 = bf16[64,8]{1,0} dot(%cat, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[1,8,8,8,1], w: f32[3,3,3,1,8]) -> f32[1,8,8,8,8] {
  %a = f32[1,8,8,8,1]{4,3,2,1,0} parameter(0)
  %w = f32[3,3,3,1,8]{4,3,2,1,0} parameter(1)
  %c1 = bf16[1,8,8,8,1]{4,3,2,1,0} convert(%a)
  %c2 = bf16[3,3,3,1,8]{4,3,2,1,0} convert(%w)
  %t = bf16[1,1,8,8,8]{4,3,2,1,0} transpose(%c1), dimensions={0,4,1,2,3}
  %f = (bf16[1,8,8,8,8]{4,3,2,1,0}, u8[0]{0}) custom-call(%t, %c2), custom_call_target="__cudnn$convForward"
  %g = (bf16[3,3,3,1,8]{4,3,2,1,0}, u8[0]{0}) custom-call(%t, %t), custom_call_target="__cudnn$convBackwardFilter"
  %m = bf16[64,8]{1,0} fusion(%c1, %c2), kind=kCustom, calls=%gemm_computation, backend_config={"kind":"__triton_gemm"}
  %ag = f32[2,8,8,8,1]{4,3,2,1,0} all-gather(%a), dimensions={0}
  ROOT %r = f32[1,8,8,8,8]{4,3,2,1,0} convert(%f)
}
'''


def test_the_op_counts_of_a_compiled_step():
    counts = load("hlo_kernels").op_counts(HLO)
    assert counts["cudnn"] == {"convBackwardFilter": 1, "convForward": 1}
    assert (counts["triton_gemm_fusions"], counts["dots"], counts["concatenates"]) == (1, 1, 1)
    assert (counts["transposes"], counts["converts"], counts["fusions"], counts["all_gathers"]) == (1, 3, 1, 1)
    assert counts["xla_convolutions"] == 0 and counts["cublas_gemms"] == 0


def test_candidates_by_name_and_their_bytes_against_xlas_own_ops():
    zoo_kernels = load("zoo_kernels")
    assert zoo_kernels.candidate_sets("xla, fused") == [("xla", []), ("fused", ["kernels.norm=fused"])]
    with pytest.raises(ValueError, match="'fast' is not a candidate"):
        zoo_kernels.candidate_sets("taps,fast")
    rows = [{"network": "n", "precision": "bfloat16", "candidate": name, "bytes_per_device": b}
            for name, b in (("taps", 120), ("xla", 100), ("fused", None))]
    rows.append({"network": "n", "precision": "float32", "candidate": "taps", "bytes_per_device": 90})
    found = {(r["precision"], r["candidate"]): r.get("bytes_vs_xla") for r in zoo_kernels.with_deltas(rows)}
    assert found == {("bfloat16", "taps"): 1.2, ("bfloat16", "xla"): 1.0, ("bfloat16", "fused"): None,
                     ("float32", "taps"): None}  # no xla row in float32: no ratio
