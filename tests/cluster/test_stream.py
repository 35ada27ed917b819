"""A dataset in a bucket, end to end on the local cluster: ``launcher data prepare s3://...`` uploads it to moto's
server (behind the suite's fault proxy, tests/support/s3.py), 4 ranks on 2 nodes stream it through a node cache
several times smaller than the dataset while the store answers a burst of 503 SlowDown, and the run completes
in one attempt; the store's credentials are nowhere in the run's files or its Slurm job; ``describe`` shows what
reading cost. The same run on 2 GPUs, stopped and resumed on 1, reads the same global batches. An object
replaced after the launch fails the attempt as bad data, naming its key, not retried; a store that does not
answer fails it as the store's fault, and the retry goes on."""
from __future__ import annotations

import json
import sysconfig
import uuid
from pathlib import Path

import pytest

from support.helpers import UNTIL_STOPPED, events, job_id_of, record, runs_json, wait_for

STDLIB = Path(sysconfig.get_paths()["stdlib"])
STEPS = 16
SHARD_BYTES = 8000  # shards of 4,000 byte tokens: the json package's sources are 28 of them
CACHE_GB = 6 * SHARD_BYTES / 2**30  # six shards, the least data.stream_window=2 needs


def stream_run(url: str, root: Path, name: str, *more: str, gpus: int = 4) -> tuple:
    """A run of the json package's shards, two at a time, 32 sequences a step (a window lasts about 4 steps), with
    a node cache of the test's own (the nodes' default one is shared by every run of the user on the machine, and
    keeps the shards another test's runs fetched)."""
    return (f"gpus={gpus}", f"data.path={url}", f"name={name}", f"data.stream_cache_dir={root / 'cache'}", f"train.steps={STEPS}", "train.global_batch=32",
            "train.log_every=1", "train.eval_every=0", "train.checkpoint_every=4", "data.stream_window=2",
            f"data.stream_cache_gb={CACHE_GB!r}", "data.store.retry_s=120", *more)


def rows(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
    return {row["step"]: row for row in map(json.loads, lines) if not row.get("final")}


@pytest.fixture
def bucket_data(slurm, s3_store, tmp_path):
    """The json package's sources prepared into the test's bucket; (its URL, the environment a user has: the
    store's address and a secret key of its own to look for)."""
    env = {**s3_store.env, "AWS_SECRET_ACCESS_KEY": f"secret-{uuid.uuid4().hex}"}
    url = f"s3://{s3_store.bucket}/json"
    prep = slurm.launcher("data", "prepare", url, str(STDLIB / "json"), "--glob", "*.py", "--shard-tokens",
                          str(SHARD_BYTES // 2), root=tmp_path, env=env)
    assert prep.returncode == 0, prep.stderr
    assert f"to {url}" in prep.stdout
    s3_store.proxy.clear()
    return url, env


def test_four_ranks_stream_a_bucket_through_a_small_cache_and_a_503_burst(slurm, s3_store, bucket_data, tmp_path):
    url, env = bucket_data
    res = slurm.launcher(*stream_run(url, tmp_path, "streamed"), root=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    s3_store.proxy.clear()  # the launch's own requests
    s3_store.proxy.fail(8, match=".bin")  # the tasks' first GETs of shards (they start seconds after sbatch)
    run_dir = tmp_path / "streamed"
    slurm.completes(job_id_of(res.stdout), run_dir, timeout=300)
    assert [e["event"] for e in events(run_dir)].count("attempt") == 1, record(run_dir)

    seen = s3_store.proxy.requests()
    shard_gets = [r for r in seen if r.method == "GET" and r.path.endswith(".bin")]
    assert sum(r.status == 503 for r in shard_gets) == 8
    served = [r for r in shard_gets if r.status in (200, 206)]
    final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["shards_fetched"] == len(served) and final["data_mb"] > 0
    assert len({r.path for r in served}) > 6  # more shards than the cache holds went through it
    assert all("node/" in r.user_agent for r in served)

    secret = env["AWS_SECRET_ACCESS_KEY"]
    for file in run_dir.rglob("*"):
        if file.is_file():
            assert secret.encode() not in file.read_bytes(), f"{file} holds the store's secret key"
    job = slurm.run("scontrol", "show", "job", "-d", job_id_of(res.stdout), check=False).stdout
    assert secret not in job

    described = slurm.launcher("describe", "streamed", root=tmp_path, env=env)
    assert described.returncode == 0, described.stderr
    assert f"Data:        {url} at {s3_store.endpoint}" in described.stdout, described.stdout
    assert "shards fetched" in described.stdout and "waited for data" in described.stdout, described.stdout

    # The same run on 2 GPUs, stopped, resumed on 1: the same global batches as on 4, step for step.
    res = slurm.launcher(*stream_run(url, tmp_path, "moved", gpus=2), root=tmp_path, env={**env, **UNTIL_STOPPED})
    assert res.returncode == 0, res.stderr
    moved = tmp_path / "moved"
    wait_for(lambda: len(rows(moved)) >= 5, 180, "five steps", patient=True)
    stopped = slurm.launcher("stop", "moved", root=tmp_path, env=env)
    assert stopped.returncode == 0 and " every rank saved it; " in stopped.stdout, stopped.stdout + stopped.stderr
    resumed = wait_for(lambda: (r := slurm.launcher("resume", "moved", "gpus=1", root=tmp_path, env=env))
                       .returncode == 0 and r, 60, "a resume accepted", interval=1)
    slurm.completes(job_id_of(resumed.stdout), moved, timeout=300)
    reference = {step: row["batch_crc"] for step, row in rows(run_dir).items()}
    assert {step: row["batch_crc"] for step, row in rows(moved).items()} == reference


def test_an_object_replaced_after_the_launch_is_bad_data_naming_its_key(slurm, s3_store, bucket_data, tmp_path):
    url, env = bucket_data
    res = slurm.launcher(*stream_run(url, tmp_path, "changed", gpus=2), root=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    key = "json/tokens_00000.bin"
    s3_store.client().put_object(Bucket=s3_store.bucket, Key=key, Body=b"\x01" * SHARD_BYTES)
    run_dir = tmp_path / "changed"
    assert slurm.wait(job_id_of(res.stdout), timeout=240) == "FAILED", record(run_dir)
    final = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "failed" and e.get("final")], 30,
                     "verdict")[0]
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds.count("attempt") == 1 and "retrying" not in kinds, kinds
    assert final["short"] == "bad data" and "not retried" in final["reason"], final
    assert f"s3://{s3_store.bucket}/{key}" in final["error"] and "changed" in final["error"], final
    assert runs_json(slurm, tmp_path, env=env)["changed"]["reason"] == "bad data"


def test_the_recipe_in_docs_data_md_works_as_written(slurm, s3_store, tmp_path):
    """docs/data.md's recipe, line by line, against the suite's store: its endpoint for the one in the docs, its
    keys in the files the docs read them from, and the launch as a dry run (nothing is trained)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
    block = text.split("## A dataset in a bucket", 1)[1].split("\n\n")[2]
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    home = tmp_path / "home"
    (home / ".s3").mkdir(parents=True)
    (home / ".s3" / "key-id").write_text(s3_store.env["AWS_ACCESS_KEY_ID"])
    (home / ".s3" / "secret").write_text(s3_store.env["AWS_SECRET_ACCESS_KEY"])
    (home / "books").mkdir()
    (home / "books" / "a.txt").write_text((STDLIB / "json" / "decoder.py").read_text() * 4)
    s3_store.client().create_bucket(Bucket="datasets")
    env = {key: value for key, value in s3_store.env.items() if key not in ("AWS_ACCESS_KEY_ID",
                                                                          "AWS_SECRET_ACCESS_KEY")}
    env.update(HOME=str(home), LAUNCHER_HOME=str(home / ".launcher"))
    assert lines[0].startswith("export AWS_ENDPOINT_URL=")
    env["AWS_ENDPOINT_URL"] = s3_store.endpoint  # the docs' store is the site's
    for line in lines[1:]:
        args = [arg.replace("~", str(home)) for arg in line.split()[1:]]
        if "data.path=s3://datasets/books" in args:
            args.append("dry_run=true")
        res = slurm.launcher(*args, root=tmp_path / "runs", env=env)
        assert res.returncode == 0, f"{line}\n{res.stderr}"
    assert "data: s3://datasets/books at " in res.stdout and "the first step waits for" in res.stdout, res.stdout


def test_a_store_that_does_not_answer_fails_the_attempt_as_its_own_fault_and_the_retry_goes_on(slurm, s3_store,
                                                                                               bucket_data, tmp_path):
    url, env = bucket_data
    res = slurm.launcher("gpus=2", f"data.path={url}", "name=outage", "train.steps=4", "train.eval_every=0",
                         "data.store.retry_s=3", "data.store.stall_s=2", f"data.stream_cache_dir={tmp_path / 'cache'}",
                         root=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    s3_store.proxy.fail(100_000, match=".bin")  # every shard's GET, until calmed
    run_dir = tmp_path / "outage"
    ended = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "attempt_ended"], 240, "the first end",
                     patient=True)[0]
    s3_store.proxy.calm()
    assert (ended["outcome"], ended["fault"], ended["short"]) == ("FAILED", "store", "store unreachable"), ended
    assert not ended["exclude"], ended  # no node blamed
    assert f"the store at {s3_store.endpoint} did not serve s3://{s3_store.bucket}/json/tokens_" in ended["cause"]
    assert "503 SlowDown" in ended["cause"], ended
    slurm.completes(wait_for(lambda: [e["job_id"] for e in events(run_dir) if e["event"] == "attempt"][1:], 120,
                             "the retry's job")[0], run_dir, timeout=300)
    (retried,) = [e for e in events(run_dir) if e["event"] == "retrying"]
    assert not retried["exclude"], retried
