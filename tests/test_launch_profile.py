"""benchmarks.launch_profile's arithmetic: the crossover it suggests and the trace summary it prints."""

import gzip
import json

import pytest

from benchmarks import launch_profile, trace_summary


def _points(*ratios):
    """Sizes 4x apart from 1024 elements; ``ratio`` = triton time / xla time at each."""
    return [{"elements": 1024 * 4**i, "triton": ratio, "xla": 1.0} for i, ratio in enumerate(ratios)]


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ((2.0, 1.5, 0.9, 0.5), 1024 * 16),  # the kernel keeps up from the third size on
        ((0.9, 1.2, 0.8, 0.7), 1024 * 16),  # a loss in between: only the sizes after it count
        ((0.5, 0.5), 1024),  # always ahead
        ((0.5, 1.1), None),  # behind at the largest size
    ],
)
def test_crossover_is_the_first_size_from_which_the_kernel_keeps_up(ratios, expected):
    assert launch_profile.crossover_elements(list(reversed(_points(*ratios)))) == expected


def test_every_job_names_a_known_section_and_setting():
    for job in launch_profile.JOBS:
        assert job.section in ("launch", "model", "ops", "crossover")
        assert job.setting in launch_profile.SETTINGS
    assert len({job.name for job in launch_profile.JOBS}) == len(launch_profile.JOBS)


def test_trace_summary_counts_stream_kernels_per_step_and_overlaps_once(tmp_path):
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7(Compute)"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "Stream #8(Compute)"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 9, "args": {"name": "XLA Ops"}},
        {"ph": "X", "pid": 1, "tid": 7, "ts": 0, "dur": 100, "name": "gemm"},
        {"ph": "X", "pid": 1, "tid": 8, "ts": 50, "dur": 100, "name": "rope"},  # overlaps the gemm by 50 µs
        {"ph": "X", "pid": 1, "tid": 7, "ts": 1000, "dur": 100, "name": "gemm"},
        {"ph": "X", "pid": 1, "tid": 9, "ts": 0, "dur": 5000, "name": "fusion op"},  # not a stream line
        {"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": 400, "name": "CommandBufferThunk::ExecuteOnStream"},
        {"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": 900, "name": "$python.py:1 step"},  # a Python frame
    ]
    path = tmp_path / "host.trace.json.gz"
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events}, handle)
    summary = trace_summary.summarise(path, steps=2)
    assert summary["device_busy_ms"] == pytest.approx(0.250 / 2)
    assert summary["device_kernels"] == 3 / 2
    assert summary["device_top"][0] == ("gemm", pytest.approx(0.1), 1.0)
    assert [name for name, *_ in summary["host_top"]] == ["CommandBufferThunk::ExecuteOnStream"]
    assert [name for name, *_ in summary["host_focus"]] == ["CommandBufferThunk::ExecuteOnStream"]
    assert "device busy 0.125 ms/step" in "\n".join(trace_summary.format_summary("t", summary))


def test_hlo_stats_count_command_buffers_fusions_and_custom_calls():
    text = """
    command_buffer {
      loop_add_fusion = f32[8]{0} fusion(p0), kind=kLoop, calls=fused_add
      gemm = (bf16[8,8]{1,0}, s8[0]{0}) custom-call(a, b), custom_call_target="__cublas$gemm"
    }
    ENTRY main {
      call = f32[8]{0} call(p0, p1), to_apply=command_buffer
      rope = (bf16[8]{0}, bf16[8]{0}) custom-call(x, y), custom_call_target="triton_kernel_call_ffi"
      loop_mul_fusion = f32[8]{0} fusion(rope), kind=kLoop, calls=fused_mul
      call.1 = f32[8]{0} call(p0, p1), to_apply=%command_buffer.1
    }"""
    assert launch_profile.hlo_stats(text) == {
        "command buffers": 2,
        "fusions": 2,
        "__cublas$gemm": 1,
        "triton_kernel_call_ffi": 1,
    }
