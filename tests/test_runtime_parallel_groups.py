"""The runtime's process groups by role (pybubble/runtime/parallel_groups.py), from torchtitan's
ParallelDims, a mesh with roles or conventional names, or explicit groups.

Every multi-process case runs in one launch of 4 gloo ranks (WORKER): each rank resolves every
case and reports the global ranks of its groups, or the error it got; the tests read rank 0's
collection of every rank's report."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from pybubble.runtime.parallel_groups import rank_sets

WORKER = textwrap.dedent('''
    import torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from pybubble.runtime import launch, sync_grads
    from pybubble.runtime.parallel_groups import resolve_groups

    def ranks(group):
        return None if group is None else dist.get_process_group_ranks(group)

    def report(**kwargs):
        try:
            g = resolve_groups(**kwargs)
        except ValueError as e:
            return {"error": str(e)}
        out = {"pp": ranks(g.pp), "dp": ranks(g.dp), "tp": ranks(g.tp), "tp_size": g.tp_size,
               "sources": [g.pp_source, g.dp_source, g.tp_source],
               "pipelines": None if g.pipelines is None else [list(p) for p in g.pipelines]}
        if g.dp is not None:  # the encoder's gradients (each rank's own: its rank) averaged over dp
            enc = nn.Linear(1, 1, bias=False)
            enc.weight.grad = torch.full((1, 1), float(dist.get_rank()))
            sync_grads(enc, None, g.dp)
            out["averaged"] = enc.weight.grad.item()
        return out

    class TitanLikeDims:
        """torchtitan's ParallelDims as the runtime sees it: the degrees, and get_mesh(name) over real
        meshes (pp outermost, each role a dimension of a mesh over the whole world), refusing a role of
        degree 1 as torchtitan's does."""

        def __init__(self, pp=1, dp_replicate=1, dp_shard=1, cp=1, tp=1):
            self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp = pp, dp_replicate, dp_shard, cp, tp
            dense = init_device_mesh("cpu", (pp, dp_replicate, dp_shard, cp, tp),
                                     mesh_dim_names=("pp", "dp_replicate", "dp_shard", "cp", "tp"))
            flat = init_device_mesh("cpu", (pp, dp_replicate * dp_shard * cp, tp), mesh_dim_names=("pp", "loss", "tp"))
            self._meshes = {n: dense[n] for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp")}
            self._meshes["loss"] = flat["loss"]

        def get_mesh(self, name):
            if self._meshes[name].size() == 1:
                raise ValueError(f"Mesh {name!r} is not available.")
            return self._meshes[name]

    def real_torchtitan():
        try:
            from torchtitan.distributed import parallel_dims
        except ImportError:
            return {"missing": True}
        parallel_dims.device_type = "cpu"  # torchtitan falls back to "cuda" on a machine without GPUs
        dims = parallel_dims.ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=1, pp=2, ep=1, world_size=4)
        dims.build_mesh()
        return report(parallel_dims=dims)

    def encoder_runtime(mesh):
        """One step of EncoderRuntime on ``mesh`` (pp 2 x dp 2), each replica with its own images: the
        encoder's gradient, which the step leaves averaged over the replicas (summed over pp)."""
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B
        from pybubble.runtime import EncoderRuntime, RuntimeOptions

        class First(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj, self.encoder_output = nn.Linear(4, 4), None
            def forward(self, microbatch):
                if microbatch.device.type == "meta":
                    return self.proj(torch.zeros(2, 4, device="meta"))
                return self.proj(self.encoder_output(int(microbatch[0])))

        torch.manual_seed(0)
        encoder, first, last = nn.Linear(3, 4), First(), nn.Linear(4, 1)
        pp_rank = mesh["pp"].get_local_rank()
        module = first if pp_rank == 0 else last
        stage = PipelineStage(module, pp_rank, 2, torch.device("cpu"), group=mesh["pp"].get_group())
        schedule = Schedule1F1B(stage, 2, loss_fn=lambda y, t: (y - t).pow(2).mean(), scale_grads=False)
        replica = mesh.get_local_rank(1)
        images = torch.randn(4, 3, generator=torch.Generator().manual_seed(10 + replica))
        runtime = EncoderRuntime(encoder, stage=stage, schedule=schedule, example=images[:2], groups=mesh,
                                 options=RuntimeOptions(mode="coarse", dp_reduce="mean"))  # stages without FSDP2/DDP
        import gc
        gc.collect()
        gc.disable()  # as a trainer that collects by hand (torchtitan's gc_freq): what a step leaves in cycles stays
        if pp_rank == 0:
            first.encoder_output = runtime.encoder_output
            runtime.step(images, torch.arange(2))
        else:
            runtime.step(images, target=torch.ones(4, 1))
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = sorted({type(o).__name__ for o in gc.garbage} & {"EncoderStep", "FillTask", "BubbleFiller", "MicrobatchRun"})
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()
        return {"dp": ranks(runtime.dp_group), "grad": [p.grad.flatten().tolist() for p in encoder.parameters()],
                "cyclic": cyclic}

    def main(rank):
        out = {}
        pp_dp_shard = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp_shard"))
        out["dp_shard"] = report(mesh=pp_dp_shard)
        out["replicate_shard"] = report(mesh=init_device_mesh("cpu", (1, 2, 2),
                                                               mesh_dim_names=("pp", "dp_replicate", "dp_shard")))
        out["foo"] = report(mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "foo")))
        out["ep"] = report(mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "ep")))
        out["no_pp"] = report(mesh=init_device_mesh("cpu", (4,), mesh_dim_names=("dp",)))
        named = init_device_mesh("cpu", (2, 2), mesh_dim_names=("stage", "replica"))
        out["roles"] = report(mesh=named, roles={"pp": "stage", "dp": "replica", "tp": None})
        out["roles_product"] = report(mesh=init_device_mesh("cpu", (1, 2, 2), mesh_dim_names=("a", "b", "c")),
                                      roles={"pp": "a", "dp": ("b", "c")})
        for case, roles in {"roles_missing": {"pp": "stage"}, "roles_unknown_dim": {"pp": "stage", "dp": "nope"},
                            "roles_twice": {"pp": "stage", "dp": ("replica", "stage")},
                            "roles_pp_product": {"pp": ("stage", "replica")}, "roles_bad_key": {"ep": "replica"},
                            "roles_not_a_name": {"pp": 3}}.items():
            out[case] = report(mesh=named, roles=roles)
        out["roles_without_mesh"] = report(roles={"pp": "pp"})
        pp_tp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "tp"))
        out["pp_tp_mesh"] = report(mesh=pp_tp)
        out["explicit"] = report(pp_group=pp_tp["pp"].get_group(), tp_group=pp_tp["tp"].get_group())
        out["explicit_dp"] = report(pp_group=pp_dp_shard["pp"].get_group(), dp_group=pp_dp_shard["dp_shard"].get_group())
        out["explicit_pp_only"] = report(pp_group=pp_tp["pp"].get_group())
        out["nothing"] = report()
        out["mesh_and_group"] = report(mesh=pp_tp, tp_group=pp_tp["tp"].get_group())
        titan_like = TitanLikeDims(pp=2, dp_shard=2)
        out["titan_like"] = report(parallel_dims=titan_like)
        out["dims_as_mesh"] = report(mesh=titan_like)
        out["titan_like_cp"] = report(parallel_dims=TitanLikeDims(pp=2, cp=2))
        out["titan_like_tp"] = report(parallel_dims=TitanLikeDims(pp=2, tp=2))
        out["titan_real"] = real_torchtitan()
        out["runtime"] = encoder_runtime(pp_dp_shard)
        try:
            encoder_runtime(init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "foo")))
        except ValueError as e:
            out["runtime_foo"] = str(e)
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, out)
        return every

    if __name__ == "__main__":
        import json
        print(json.dumps(launch(main, 4, timeout=120)))
''')


@pytest.fixture(scope="module")
def every(tmp_path_factory):
    """Every rank's report (a list indexed by global rank), from one launch of 4 ranks."""
    path = tmp_path_factory.mktemp("groups") / "worker.py"
    path.write_text(WORKER)
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=path.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def case(every, name):
    return [rank[name] for rank in every]


def test_a_torchtitan_mesh_pp_dp_shard_averages_over_dp_shard(every):
    for rank, got in enumerate(case(every, "dp_shard")):
        assert got["pp"] == [rank % 2, rank % 2 + 2]
        assert got["dp"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert got["sources"] == ["mesh dimension 'pp'", "mesh dimension 'dp_shard'", "no tp dimension in the mesh, by its names"]
        assert got["averaged"] == pytest.approx(sum(got["dp"]) / 2)
        assert got["pipelines"] == [[0, 2], [1, 3]]
        assert got["tp"] is None and got["tp_size"] == 1


def test_dp_replicate_and_dp_shard_average_over_their_product(every):
    for got in case(every, "replicate_shard"):
        assert got["dp"] == [0, 1, 2, 3]
        assert got["sources"][1] == "mesh dimensions ('dp_replicate', 'dp_shard'), their product"
        assert got["averaged"] == pytest.approx(1.5)


@pytest.mark.parametrize("name, dim", [("foo", "foo"), ("ep", "ep")])
def test_a_mesh_whose_data_parallel_dimension_is_unknown_is_refused_naming_its_dimensions(every, name, dim):
    errors = {got["error"] for got in case(every, name)}
    assert len(errors) == 1
    error, = errors
    assert error.startswith(f"mesh: dimensions ('pp', '{dim}') of sizes (2, 2): ('{dim}',) is in no role (its names)")
    assert f"roles={{'pp': 'pp', 'dp': ('{dim}',), 'tp': None}}" in error


def test_a_mesh_without_pp_is_refused(every):
    got = case(every, "no_pp")[0]
    assert got["error"].startswith("mesh: no 'pp' dimension (its dimensions: ('dp',)); name the pipeline's dimension")


def test_roles_map_any_dimension_names(every):
    plain, named = case(every, "dp_shard"), case(every, "roles")
    assert [(g["pp"], g["dp"], g["averaged"]) for g in named] == [(g["pp"], g["dp"], g["averaged"]) for g in plain]
    assert named[0]["sources"][:2] == ["mesh dimension 'stage'", "mesh dimension 'replica'"]
    assert named[0]["pipelines"] == [[0, 2], [1, 3]]
    for got in case(every, "roles_product"):
        assert got["dp"] == [0, 1, 2, 3] and got["sources"][1] == "mesh dimensions ('b', 'c'), their product"


@pytest.mark.parametrize("name, error", [
    ("roles_missing", "mesh: dimensions ('stage', 'replica') of sizes (2, 2): ('replica',) is in no role "
                      "(roles={'pp': ('stage',), 'dp': (), 'tp': ()})"),
    ("roles_unknown_dim", "roles: dp names 'nope', not a dimension of the mesh (its dimensions: ('stage', 'replica'))"),
    ("roles_twice", "roles: 'stage' is in dp and in pp: a dimension has one role"),
    ("roles_pp_product", "roles: pp is ('stage', 'replica'): one dimension (only dp may be a product of several)"),
    ("roles_bad_key", "roles: 'ep' is not a role (pp, dp, tp)"),
    ("roles_not_a_name", "roles: pp is 3, not a dimension name, a tuple of them or None"),
    ("dims_as_mesh", "mesh: a TitanLikeDims, not a DeviceMesh (a ParallelDims goes to parallel_dims=)"),
    ("roles_without_mesh", "roles: {'pp': 'pp'} names dimensions of a mesh, and no mesh is given"),
])
def test_bad_roles_are_refused_naming_the_field(every, name, error):
    assert case(every, name)[0]["error"].startswith(error)


def test_explicit_groups_detect_tensor_parallelism(every):
    for rank, (mesh, explicit) in enumerate(zip(case(every, "pp_tp_mesh"), case(every, "explicit"))):
        assert explicit["tp"] == mesh["tp"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert explicit["tp_size"] == mesh["tp_size"] == 2
        assert explicit["pp"] == mesh["pp"] and explicit["dp"] is mesh["dp"] is None
        assert explicit["sources"] == ["pp_group", "no dp_group", "tp_group"]
        assert explicit["pipelines"] is None
    for rank, got in enumerate(case(every, "explicit_dp")):
        assert got["dp"] == [rank - rank % 2, rank - rank % 2 + 1] and got["tp"] is None


def test_groups_that_leave_ranks_without_a_role_are_refused(every):
    assert case(every, "explicit_pp_only")[0]["error"].startswith(
        "pp_group: pp 2 x dp 1 x tp 1 = 2 ranks, the world has 4 (pp 2 (pp_group), dp 1 (no dp_group), "
        "tp 1 (no tp_group)); the other ranks' role is unknown")
    assert case(every, "nothing")[0] == {
        "pp": [0, 1, 2, 3], "dp": None, "tp": None, "tp_size": 1, "pipelines": None,
        "sources": ["the world (no pp_group, no stage group)", "no dp_group", "no tp_group"]}
    assert case(every, "mesh_and_group")[0]["error"] == (
        "mesh: give one of parallel_dims, mesh (with roles) or pp_group/dp_group/tp_group, not mesh and tp_group")


def test_a_parallel_dims_gives_its_meshes_by_role(every):
    for rank, got in enumerate(case(every, "titan_like")):
        assert got["pp"] == [rank % 2, rank % 2 + 2] and got["dp"] == [rank - rank % 2, rank - rank % 2 + 1]
        assert got["sources"] == ["parallel_dims.get_mesh('pp')",
                                  "parallel_dims.get_mesh('loss'): dp_replicate x dp_shard x cp",
                                  "parallel_dims: tp 1"]
        assert got["pipelines"] == [[0, 2], [1, 3]]
    # Context parallelism: the cp ranks see other parts of the same sequences; their encoder
    # gradients are averaged as torchtitan reduces the LLM's (over dp_replicate x dp_shard x cp).
    for rank, got in enumerate(case(every, "titan_like_cp")):
        assert got["dp"] == [rank - rank % 2, rank - rank % 2 + 1]
    for rank, got in enumerate(case(every, "titan_like_tp")):
        assert got["tp"] == [rank - rank % 2, rank - rank % 2 + 1] and got["dp"] is None and got["tp_size"] == 2


def test_torchtitans_own_parallel_dims(every):
    got = case(every, "titan_real")
    if got[0].get("missing"):
        pytest.skip("torchtitan is not installed (optional: pip install torchtitan)")
    assert got == case(every, "titan_like")


def test_encoder_runtime_averages_the_encoders_gradients_over_dp_shard(every):
    runs = case(every, "runtime")
    for rank, run in enumerate(runs):
        assert run["dp"] == [rank - rank % 2, rank - rank % 2 + 1]
    # Every rank ends with the same gradient: summed over the pipeline, averaged over the replicas
    # (which saw other images: without the average the replicas' encoders would drift apart).
    assert all(run["grad"] == runs[0]["grad"] for run in runs)
    assert any(abs(x) > 0 for p in runs[0]["grad"] for x in p)
    assert case(every, "runtime_foo")[0].startswith("mesh: dimensions ('pp', 'foo') of sizes (2, 2): ('foo',)")


def test_a_step_leaves_no_encoder_work_in_reference_cycles(every):
    # the step's tasks and pieces' state are freed when it ends, not by a later full collection
    # (a 200 ms stall of some later step on the trainer's CPU ranks)
    assert [run["cyclic"] for run in case(every, "runtime")] == [[]] * 4


def test_rank_sets_follow_the_mesh_layout():
    ranks = torch.arange(8).reshape(2, 2, 2)
    names = ("pp", "dp_replicate", "dp_shard")
    assert rank_sets(ranks, names, ("pp",)) == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert rank_sets(ranks, names, ("dp_replicate", "dp_shard")) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert rank_sets(ranks, names, ("dp_shard", "dp_replicate")) == ((0, 2, 1, 3), (4, 6, 5, 7))
    assert rank_sets(ranks, ("dp_replicate", "pp", "tp"), ("dp_replicate", "tp")) == ((0, 1, 4, 5), (2, 3, 6, 7))

