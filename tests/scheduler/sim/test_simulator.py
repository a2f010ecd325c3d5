"""The trace simulator and its readers, on small traces written by the tests."""

import json

import pytest
from django.core.management import CommandError, call_command

from scheduler.sim.simulator import simulate, uniform_nodes
from scheduler.sim.traces import TraceJob, detect, read_jobs

PHILLY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-01 00:00:10,100.0,1,100.0,a
2017-10-01 00:00:00,50.0,2,100.0,b
2017-10-01 00:01:00,30.0,16,480.0,a
"""
OPENB = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,4000,1024,1,500,,LS,Running,0,100,0
p1,8000,2048,2,1000,,LS,Running,10,50,10
p2,1000,512,0,0,,LS,Running,5,30,5
"""
GENERIC = "submit_time,duration,num_gpus,gpu_fraction\n0,100,1,0.5\n0,100,1,0.5\n10,50,1,1\n"


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_it_reads_philly_sorted_with_seconds_from_the_first_submit(tmp_path):
    path = write(tmp_path, "philly.csv", PHILLY)
    assert detect(path) == "philly"
    jobs = read_jobs(path, max_gpus=8)
    assert [(j.submit, j.gpu_count, j.user) for j in jobs] == [(0.0, 2, "b"), (10.0, 1, "a")]


def test_it_reads_openb_pods_with_thousandths_of_a_card(tmp_path):
    jobs = read_jobs(write(tmp_path, "pods.csv", OPENB))
    assert [(j.gpu_count, j.gpu_milli, j.cpu, j.duration) for j in jobs] == [
        (1, 500, 4000, 100.0),
        (0, 1000, 1000, 25.0),
        (2, 1000, 8000, 40.0),
    ]


def test_two_halves_share_one_card_and_whole_card_only_cannot(tmp_path):
    jobs = read_jobs(write(tmp_path, "g.csv", GENERIC))
    shared = simulate(jobs, uniform_nodes(1), policy="mlfq")
    whole = simulate(jobs, uniform_nodes(1), policy="mlfq", whole_cards_only=True)
    assert shared.finished == whole.finished == 3
    assert shared.avg_queueing < whole.avg_queueing


def test_mlfq_lets_short_work_overtake_a_long_job_and_fifo_does_not():
    jobs = [TraceJob(0, 0, 10_000, 1), *[TraceJob(i, 100 + i, 60, 1) for i in range(1, 6)]]
    mlfq = simulate(jobs, uniform_nodes(1), policy="mlfq", quantum=60)
    fifo = simulate(jobs, uniform_nodes(1), policy="fifo")
    assert mlfq.preemptions > 0 and mlfq.avg_jct < fifo.avg_jct / 2


def test_the_command_prints_one_json_line_with_the_metrics(tmp_path, capsys):
    call_command("simulate", trace=str(write(tmp_path, "g.csv", GENERIC)), policy="srtf", gpus=8)
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["policy"] == "srtf" and result["jobs"] == 3 and result["finished"] == 3
    assert {"avg_jct", "p50_jct", "p95_jct", "avg_queueing", "gpu_allocation_pct", "makespan", "preemptions"} <= set(
        result
    )


def test_the_command_draws_a_plot(tmp_path, capsys):
    out = tmp_path / "run.png"
    call_command("simulate", trace=str(write(tmp_path, "g.csv", GENERIC)), gpus=1, plot=str(out))
    assert out.stat().st_size > 1000


def test_the_command_refuses_an_unknown_trace_format(tmp_path):
    with pytest.raises(CommandError, match="unknown trace format"):
        call_command("simulate", trace=str(write(tmp_path, "x.csv", "a,b\n1,2\n")), gpus=8)


def test_jobs_wait_for_their_gpu_model_on_a_cluster_of_several_models(tmp_path, capsys):
    trace = write(tmp_path, "m.csv", "submit_time,duration,num_gpus,gpu_model\n0,100,1,A100-80GB\n0,100,1,A100-80GB\n")
    call_command("simulate", trace=str(trace), nodes="1x1xRTX3090, 1x1xA100-80GB", policy="fifo")
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["finished"] == 2
    assert result["avg_jct"] == 150  # one after the other on the one A100; the RTX 3090 stays free


def test_a_launch_overhead_holds_the_cards_before_the_job_runs():
    jobs = [TraceJob(0, 0, 100, 1), TraceJob(1, 0, 100, 1)]
    result = simulate(jobs, uniform_nodes(1), policy="fifo", launch_overhead=5)
    assert result.avg_jct == pytest.approx((105 + 210) / 2)
