"""The ``triton`` engine's load generator: a seeded workload's queries sent to the real Triton server over gRPC.

Runs on its own in the Triton environment's Python (``python client.py PLAN.json OUT.csv``: tritonclient's asyncio
gRPC client, numpy). The plan (written by :mod:`dvasim.engines.triton.engine`) holds the server's address, the
model, and either the open-loop arrival times (ms from the start; Poisson, stepping or a trace, as the workload
drew them) or a closed loop (``clients``, ``think_ms``, ``n_queries``), with each query's input length and
priority level.

Open loop: every query is sent at its arrival time by the event loop's timer (``loop.call_at``, on a
``select(2)`` loop: the default epoll loop rounds every timer up to the next whole millisecond), whatever the
server is doing; closed loop: each client sends its next query ``think_ms`` after its last answer. For every query
the record keeps its arrival (open loop: the plan's; closed loop: the moment its client decided to send it), when
the send began (``sent``: the client's own lag is ``sent - arrival``), when the answer came (``done``), and its
status: ``ok``, ``rejected`` (the queue was full: Triton's "Exceeds maximum queue size"), ``timed_out`` (its
queue timeout expired) or ``error`` (anything else, with the server's message). Times are
``time.monotonic_ns`` (Triton's trace clock); ``t0_ns`` is the plan's time zero.

Before time zero the client sends ``warmup`` untimed requests one by one (request ids ``warmup0``, ...: the
records leave them out). The client stops on its own: after the last answer, or ``deadline_s`` after the last send (queries still
unanswered are recorded as ``error``, "no answer").
"""

import asyncio
import csv
import json
import selectors
import sys
import time

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

REJECTED = ("exceeds maximum queue size",)
TIMED_OUT = ("request timeout expired",)


def status_of(message: str) -> str:
    m = message.lower()
    if any(s in m for s in REJECTED):
        return "rejected"
    if any(s in m for s in TIMED_OUT):
        return "timed_out"
    return "error"


async def run(plan: dict, out_path: str) -> None:
    client = grpcclient.InferenceServerClient(plan["url"])
    n = int(plan["n_queries"])
    lens = np.asarray(plan["seq_lens"], dtype=np.int32)
    prio = plan.get("priorities")
    rec = {"arrival": [np.nan] * n, "sent": [0] * n, "done": [0] * n, "status": [""] * n, "message": [""] * n}
    loop = asyncio.get_running_loop()
    t0 = time.monotonic_ns() + int(plan.get("lead_ms", 200) * 1e6)
    pending: set = set()

    async def one(i: int) -> None:
        x = InferInput("LEN", [1, 1], "INT32")
        x.set_data_from_numpy(lens[i:i + 1].reshape(1, 1))
        kwargs = {"priority": int(prio[i])} if prio is not None else {}
        rec["sent"][i] = time.monotonic_ns()
        try:
            await client.infer(plan["model"], [x], request_id=str(i), **kwargs)
            rec["status"][i] = "ok"
        except InferenceServerException as e:
            rec["status"][i], rec["message"][i] = status_of(str(e)), " ".join(str(e).split())[:200]
        rec["done"][i] = time.monotonic_ns()

    def fire(i: int) -> None:
        task = loop.create_task(one(i))
        pending.add(task)
        task.add_done_callback(pending.discard)

    for w in range(int(plan.get("warmup", 0))):  # untimed: the server's and the stub's first requests are slow
        x = InferInput("LEN", [1, 1], "INT32")
        x.set_data_from_numpy(lens[:1].reshape(1, 1))
        await client.infer(plan["model"], [x], request_id=f"warmup{w}")
    t0 = max(t0, time.monotonic_ns() + int(plan.get("lead_ms", 200) * 1e6))
    # the event loop's clock is time.monotonic (seconds): the same clock as monotonic_ns
    if plan.get("closed") is None:
        arrivals = np.asarray(plan["arrivals_ms"], dtype=float)
        for i, a in enumerate(arrivals):
            rec["arrival"][i] = t0 + a * 1e6
            loop.call_at((t0 + a * 1e6) / 1e9, fire, i)
        last = t0 / 1e9 + float(arrivals[-1]) / 1e3
        await asyncio.sleep(max(0.0, last - loop.time()) + 0.001)
        if pending:
            await asyncio.wait(set(pending), timeout=float(plan.get("deadline_s", 60)))
    else:
        clients, think = int(plan["closed"]["clients"]), float(plan["closed"]["think_ms"])
        counter = iter(range(n))

        async def client_loop() -> None:
            await asyncio.sleep(max(0.0, t0 / 1e9 - loop.time()))
            for i in counter:
                rec["arrival"][i] = time.monotonic_ns()
                await one(i)
                if think > 0:
                    await asyncio.sleep(think / 1e3)

        await asyncio.wait_for(asyncio.gather(*[client_loop() for _ in range(clients)]),
                               timeout=float(plan.get("deadline_s", 60)) + n)
    for t in list(pending):
        t.cancel()
    for i in range(n):
        if not rec["status"][i]:
            rec["status"][i], rec["message"][i] = "error", "no answer before the client's deadline"
    await client.close()
    with open(out_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([f"# t0_ns: {t0}"])
        w.writerow(["qid", "arrival_ns", "sent_ns", "done_ns", "status", "message"])
        for i in range(n):
            a = rec["arrival"][i]
            w.writerow([i, "" if a != a else int(a), rec["sent"][i] or "", rec["done"][i] or "", rec["status"][i],
                        rec["message"][i]])


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        todo = json.load(f)
    # select(2)'s timeout is in us; the default (epoll) rounds every timer up to the next whole ms
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        loop.run_until_complete(run(todo, sys.argv[2]))
    finally:
        loop.close()
