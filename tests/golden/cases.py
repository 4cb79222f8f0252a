"""The fixed set of runs whose every query timestamp the golden test compares exactly (issue 12).

Every policy, every device-sharing mode, buffer pairs 1 to 3, instances 1 and 2, open (Poisson, stepping,
explicit with simultaneous arrivals) and closed loads, jitter, admission delays and a host model. Each case is a
full config for :func:`dvasim.run`; ``make_golden.py`` runs them and writes ``golden.npz``.
"""

from __future__ import annotations

N = 300  # queries per case: enough to reach every batching path, small enough for a test of a few seconds

VGG = {"name": "vgg19", "device": "titanrtx", "stages": 4}
RESNET = {"name": "resnet152", "device": "titanrtx", "stages": 3}
BERT2 = {"name": "bert_base", "device": "titanrtx", "stages": 2}
BERT4 = {"name": "bert_base", "device": "titanrtx", "stages": 4}
DEFAULT = {"table": "traces/default/vgg16_titanx_4stages.csv"}


def _poisson(rate, n=N, seed=3, **kw):
    return {"kind": "poisson", "rate_qps": rate, "n_queries": n, "seed": seed, **kw}


def _case(model, policy, workload, **engine):
    # the engine's own exactness: the golden runs were made with the GPU's time alone (before serving stacks
    # existed), so they name that stack; a case with [engine.host] runs the stack "custom" it implies
    case = {"model": model, "policy": policy, "workload": workload, "qos": {"target_ms": 200.0},
            "engine": {"progress": False, **engine}}
    if "host" not in engine:
        case["server"] = {"stack": "gpu-only"}
    return case


CASES: dict[str, dict] = {}
POLICIES = {
    "zerobatch": {"name": "zerobatch", "max_batch_size": 32},
    "delaybatch": {"name": "delaybatch", "max_batch_size": 32, "max_queue_delay_ms": 8.0},
    "delaybatch-preferred": {"name": "delaybatch", "max_batch_size": 32, "max_queue_delay_ms": 8.0,
                             "preferred_batch_size": [4, 8]},
    "dvabatch": {"name": "dvabatch", "max_batch_size": 32},
    "dvabatch-pipelined": {"name": "dvabatch", "max_batch_size": 32, "split_manner": "pipelined"},
    "dvabatch-multientry": {"name": "dvabatch", "max_batch_size": 32, "policies": []},
    "dvabatch-window": {"name": "dvabatch", "max_batch_size": 32, "max_queue_delay_ms": 4.0},
    "dvabatch-split": {"name": "dvabatch-split", "max_batch_size": 32},
}
# every policy on every sharing mode, at a load that batches (VGG19, 4 stages)
for pname, pol in POLICIES.items():
    for sharing in ("fluid", "exclusive", "parallel", "cores"):
        CASES[f"vgg19-{pname}-{sharing}"] = _case(VGG, pol, _poisson(400.0), sharing=sharing, cores=4)
# buffer pairs 1..3 and instances 1..2 under the three paper systems
for pname in ("zerobatch", "delaybatch", "dvabatch"):
    for pairs in (1, 2, 3):
        for inst in (1, 2):
            CASES[f"resnet152-{pname}-pairs{pairs}-inst{inst}"] = _case(
                RESNET, POLICIES[pname], _poisson(300.0, seed=5), buffer_pairs=pairs, instances=inst)
# input diversity (Policy I clustering) on BERT with GLUE lengths; 2 and 4 stages
for pname in ("zerobatch", "delaybatch", "dvabatch"):
    for model, tag in ((BERT2, "bert2"), (BERT4, "bert4")):
        CASES[f"{tag}-{pname}-rte"] = _case(model, POLICIES[pname], _poisson(250.0, seq_len_dist="glue:RTE"))
# closed loops (answers and sends at the same instants), with and without think time
for pname in ("zerobatch", "delaybatch", "dvabatch"):
    CASES[f"vgg19-{pname}-closed8"] = _case(VGG, POLICIES[pname], {"kind": "closed", "clients": 8, "n_queries": N})
    CASES[f"bert2-{pname}-closed4-think"] = _case(
        BERT2, POLICIES[pname], {"kind": "closed", "clients": 4, "n_queries": N, "think_ms": 3.0,
                                 "seq_len_dist": "glue:MRPC"})
# stepping loads through overload
for pname in ("zerobatch", "delaybatch", "dvabatch"):
    CASES[f"default-{pname}-stepping"] = _case(
        DEFAULT, POLICIES[pname], {"kind": "stepping", "start_qps": 50.0, "end_qps": 2000.0, "step_queries": 60,
                                   "n_queries": 420, "seed": 2})
# simultaneous arrivals (explicit), jitter, admission delays, launch overhead, co-run slowdown
_burst = {"kind": "explicit", "arrivals_ms": [float(5 * (k // 7)) for k in range(140)]}
for pname in ("zerobatch", "dvabatch", "dvabatch-pipelined"):
    CASES[f"vgg19-{pname}-bursts"] = _case(VGG, POLICIES[pname], _burst, buffer_pairs=2)
    CASES[f"vgg19-{pname}-jitter"] = _case(
        VGG, POLICIES[pname], _poisson(350.0, seed=9), service_cv=0.3, admission_delay_ms=[0.05, 0.1, 0.4, 2.0],
        launch_overhead_ms=0.05, corun_slowdown=1.1)
    CASES[f"vgg19-{pname}-cores-launch"] = _case(
        VGG, POLICIES[pname], _poisson(200.0, seed=4), sharing="cores", cores=2, launch_overhead_ms=0.2,
        corun_slowdown=1.18)
# the host of a GPU run: launch costs, launching cores, the interpreter lock, stalls
for pname in ("zerobatch", "delaybatch", "dvabatch"):
    CASES[f"bert2-{pname}-host"] = _case(
        BERT2, POLICIES[pname], _poisson(300.0, seed=6, seq_len_dist="glue:RTE"), launch_overhead_ms=0.1,
        service_cv=0.1,
        host={"modules": "eager", "cores": 2, "launch_ms": [0.4, 0.5], "launch_per_row_ms": [0.01, 0.01],
              "copy_ms": [0.05, 0.05], "python_ms": 0.02, "stall_prob": 0.02, "stall_ms": [3.0, 6.0, 20.0]})

# exact ties: dyadic stage times and arrivals on a 0.5 ms grid, so completions, arrivals, window deadlines and
# closed-loop sends fall on the same instants; two instances on a parallel device finish together
DYADIC = {"table": "tests/golden/dyadic_3stages.csv"}
_grid = {"kind": "explicit", "arrivals_ms": [0.5 * ((k * 7) % 11 + 3 * (k // 4)) for k in range(96)]}
for pname, pol in (("zerobatch", {"name": "zerobatch", "max_batch_size": 8}),
                   ("delaybatch", {"name": "delaybatch", "max_queue_delay_ms": 2.0, "max_batch_size": 8}),
                   ("dvabatch", {"name": "dvabatch", "max_batch_size": 8})):
    for sharing, inst in (("parallel", 2), ("fluid", 1), ("exclusive", 2)):
        CASES[f"dyadic-{pname}-{sharing}-inst{inst}-grid"] = _case(DYADIC, pol, _grid, sharing=sharing,
                                                                   instances=inst)
        CASES[f"dyadic-{pname}-{sharing}-inst{inst}-closed"] = _case(
            DYADIC, pol, {"kind": "closed", "clients": 6, "n_queries": 120}, sharing=sharing, instances=inst)

# Triton's instance pipeline by release (issue 33): payloads formed ahead, frozen (21.10) or growing (current),
# merged at dequeue, TensorRT's inputs-consumed release; and DVABatch as its authors' backend schedules it
LINK = {"name": "linknet", "device": "titanrtx", "stages": 4}
for release in ("21.10", "current"):
    for pname in ("zerobatch", "delaybatch"):
        case = _case(RESNET, POLICIES[pname], _poisson(330.0, seed=5), instances=2 if release == "current" else 1)
        case["server"]["triton_release"] = release
        CASES[f"resnet152-{pname}-r{release}"] = case
_waves = {"kind": "explicit", "arrivals_ms": [float(40 * (k // 50) + k % 50 * 0.01) for k in range(300)]}
for tag, model, wl, mbs in (("vgg19", VGG, _poisson(300.0, seed=7), 32), ("linknet", LINK, _waves, 64),
                            ("bert2", BERT2, _poisson(300.0, seed=7, seq_len_dist="glue:RTE"), 32)):
    case = _case(model, {"name": "dvabatch-built", "max_batch_size": mbs}, wl)
    case["server"]["triton_release"] = "21.10"
    CASES[f"{tag}-dvabatch-built"] = case

# columns compared (every timestamp and identity of a query's record)
COLUMNS = ("query_id", "arrival_ms", "seen_ms", "admitted_ms", "start_ms", "finish_ms", "seq_len", "batch_id",
           "exit_batch_id", "exit_batch_size")
