"""A real multi-node Ray cluster on one machine (two raylets): PPO with the actor and critic groups
spanning both nodes gives the same metrics as the single-node layout for the same seed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import ray
    from ray.cluster_utils import Cluster

    from rlflow.single_controller import init_ray
    from rlflow.config import load_config
    from rlflow.trainer.main_ppo import build_trainer

    out_dir = sys.argv[1]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 150 * 2**20})
    cluster.add_node(num_cpus=2, object_store_memory=150 * 2**20)
    cluster.wait_for_nodes()
    init_ray(address=cluster.address)
    common = [
        "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false",
        "trainer.logger=[jsonl]", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.resume_mode=disable", "trainer.cpus_per_worker=1",
    ]
    layouts = {
        "two_nodes": ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"],
        "one_node": ["trainer.nnodes=1", "trainer.n_gpus_per_node=2"],
    }
    result = {}
    for name, layout in layouts.items():
        cfg = load_config(common + layout + [f"trainer.log_dir={out_dir}/{name}", f"trainer.default_local_dir={out_dir}/{name}/ckpt"], config_name="demo_two_ranks")
        trainer = build_trainer(cfg)
        try:
            trainer.init_workers()
            where = {
                role: [node for node, _ in group.execute_fn(lambda w: w.get_node_and_pid())]
                for role, group in (("actor", trainer.groups.actor), ("critic", trainer.groups.critic))
            }
            trainer.fit()
        finally:
            trainer.shutdown()
        result[name] = {"where": where, "history": trainer.history}
    print("RESULT " + json.dumps(result))
    ray.shutdown()
    cluster.shutdown()
    """
)


@pytest.mark.slow
def test_two_node_cluster_matches_single_node(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    two, one = result["two_nodes"], result["one_node"]
    # Ranks 0 and 1 of each role sit on different nodes in the two-node layout, on one node otherwise.
    for role in ("actor", "critic"):
        assert len(set(two["where"][role])) == 2, two["where"]
        assert len(set(one["where"][role])) == 1, one["where"]
    assert two["where"]["actor"] == two["where"]["critic"]  # colocated bundle by bundle
    skip = ("timing_s/", "timing_per_token_ms/", "perf/")
    for a, b in zip(two["history"], one["history"], strict=True):
        keys = {k for k in a if not k.startswith(skip)}
        assert keys == {k for k in b if not k.startswith(skip)}
        for k in keys:
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-7), k
