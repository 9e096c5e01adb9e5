"""Offloading a 60 MB JSON response, measured against the obvious alternatives in one run.

    python bench/offload.py [--mb 60]

(a) the call through the gateway (which offloads it) vs the same call straight to the upstream;
(b) response_outline vs `jq '{k: keys, n: (.data|length)}'` on the same file;
(c) 20 successive response_slice calls (following next_path) vs one outline;
(d) response_query's group-by (the first query converts the file to DuckDB) vs the same group-by in jq,
    and 20 later queries;
and the gateway's peak memory (VmHWM) relative to the file size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import call, stdio_session, table, write_config

ORDERS_PER_MB = 5000 / 1.377


def gateway_pid(config: Path) -> int | None:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"gateway" in cmdline and str(config).encode() in cmdline:
                return int(proc.name)
    return None


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


async def main(mb: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-offload-"))
    count = int(mb * ORDERS_PER_MB)
    rows = [["measure", "gateway", "alternative", "ratio", "target"]]

    t = time.perf_counter()
    async with stdio_session(["-m", "gateway.cli.demo_upstream"], tmp / "direct.log") as direct:
        result = await call(direct, "list_orders", {"count": count})
    direct_s = time.perf_counter() - t
    size = len(result.content[0].text.encode())
    del result

    cfg = write_config(tmp / "gw.toml", tmp / "ws", ["offload"], max_response_size=262144)
    async with stdio_session(["-m", "gateway", "--config", str(cfg)], tmp / "gw.log") as gw:
        await call(gw, "demo__echo", {"text": "warm"})
        pid = gateway_pid(cfg)
        idle = peak_rss(pid) if pid else 0
        t = time.perf_counter()
        reply = json.loads((await call(gw, "demo__list_orders", {"count": count})).content[0].text)
        offload_s = time.perf_counter() - t
        after_call = peak_rss(pid) if pid else 0
        ref = reply["fileRef"]
        rows.append(
            [
                "(a) call, 60 MB result",
                f"{offload_s:.2f} s (offloaded)",
                f"{direct_s:.2f} s (direct)",
                f"{offload_s / direct_s:.2f}x",
                "<= 1.5x",
            ]
        )
        path = Path(ref["path"])

        t = time.perf_counter()
        outline = await call(gw, "response_outline", {"path": ref["id"]})
        first_outline_s = time.perf_counter() - t
        stages = {"after the call": after_call, "after response_outline": peak_rss(pid) if pid else 0}
        assert not outline.is_error, outline
        # cold: the same streaming outline in a fresh process (no cache, nothing started in the background)
        code = "import sys; from pathlib import Path; from plugins.offload import json_outline; json_outline.outline(Path(sys.argv[1]))"
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, str(path)], check=True)
        outline_s = time.perf_counter() - t
        label = "(b) outline, cold (new process)"
        if shutil.which("jq"):
            t = time.perf_counter()
            subprocess.run(["jq", "{k: keys, n: (.data|length)}", str(path)], check=True, capture_output=True)
            jq_s = time.perf_counter() - t
            rows.append([label, f"{outline_s:.2f} s", f"{jq_s:.2f} s (jq)", f"{outline_s / jq_s:.2f}x", "<= 1.0x"])
        else:
            rows.append([label, f"{outline_s:.2f} s", "jq not installed", "-", "<= 1.0x"])
        rows.append(
            [
                "    response_outline right after the call",
                f"{first_outline_s:.2f} s",
                "(begun in the background at offload)",
                "",
                "",
            ]
        )
        t = time.perf_counter()
        json.loads(path.read_text())
        load_s = time.perf_counter() - t
        rows.append(
            [
                "    outline vs json.load",
                f"{outline_s:.2f} s",
                f"{load_s:.2f} s (json.load)",
                f"{outline_s / load_s:.2f}x",
                "",
            ]
        )

        json_path = f"data.{count // 2}"
        t = time.perf_counter()
        for _ in range(20):
            sliced = (await call(gw, "response_slice", {"path": ref["id"], "json_path": json_path})).structured_content
            json_path = sliced["next_path"]
        slices_s = time.perf_counter() - t
        stages["after 20 slices"] = peak_rss(pid) if pid else 0
        rows.append(
            [
                "(c) 20 slices from the middle",
                f"{slices_s:.2f} s",
                f"{outline_s:.2f} s (1 outline)",
                f"{slices_s / outline_s:.2f}x",
                "<= 2.0x",
            ]
        )

        t = time.perf_counter()
        await call(gw, "response_slice", {"path": ref["id"], "json_path": f"data.{count // 3}"})
        random_s = time.perf_counter() - t
        rows.append(
            [
                "    1 slice at a new deep index",
                f"{random_s:.2f} s",
                f"{outline_s:.2f} s (1 outline)",
                f"{random_s / outline_s:.2f}x",
                "",
            ]
        )
        t = time.perf_counter()
        found = await call(gw, "response_search", {"path": ref["id"], "query": "Seoul refunded"})
        search_s = time.perf_counter() - t
        stages["after response_search"] = peak_rss(pid) if pid else 0
        assert not found.is_error
        rows.append(
            [
                "    response_search",
                f"{search_s:.2f} s",
                f"{outline_s:.2f} s (1 outline)",
                f"{search_s / outline_s:.2f}x",
                "",
            ]
        )
        # (d) response_query: the same group-by in DuckDB and in jq. The result was converted to DuckDB in the
        # background right after the offload (one thread, beside the outline); a query sent before that
        # finishes waits for it: about as long as a cold outline.
        group_by = (
            "SELECT customer.city, count(*) AS n, round(avg(total), 2) AS avg_total FROM items "
            "WHERE status = 'refunded' GROUP BY 1 ORDER BY 1"
        )
        t = time.perf_counter()
        answer = await call(gw, "response_query", {"path": ref["id"], "sql": group_by})
        first_query_s = time.perf_counter() - t
        stages["after the first query"] = peak_rss(pid) if pid else 0
        assert not answer.is_error, answer.content[0].text
        if shutil.which("jq"):
            jq_program = (
                '[.data[] | select(.status == "refunded")] | group_by(.customer.city) '
                "| map({city: .[0].customer.city, n: length, avg: (map(.total) | add / length)})"
            )
            t = time.perf_counter()
            subprocess.run(["jq", jq_program, str(path)], check=True, capture_output=True)
            jq_group_s = time.perf_counter() - t
            rows.append(
                [
                    "response_query group-by, first query",
                    f"{first_query_s:.2f} s",
                    f"{jq_group_s:.2f} s (jq)",
                    f"{first_query_s / jq_group_s:.2f}x",
                    "<= 1.5x",
                ]
            )
        later = []
        for status in ["paid", "shipped", "pending", "refunded"] * 5:
            sql = f"SELECT customer.city, count(*), sum(total) FROM items WHERE status = '{status}' GROUP BY 1"
            t = time.perf_counter()
            answer = await call(gw, "response_query", {"path": ref["id"], "sql": sql})
            later.append(time.perf_counter() - t)
            assert not answer.is_error
        later.sort()
        rows.append(["    later queries, p50 of 20", f"{later[10] * 1000:.0f} ms", "", "", "<= 50 ms"])
        peak = peak_rss(pid) if pid else 0
    rows.append(
        [
            "peak memory (VmHWM), whole run",
            f"{peak / 2**20:.0f} MB",
            f"{size / 2**20:.0f} MB (file)",
            f"{peak / size:.2f}x",
            "<= 3x",
        ]
    )
    rows.append(
        [
            "    peak above idle process",
            f"{(peak - idle) / 2**20:.0f} MB",
            f"{idle / 2**20:.0f} MB idle",
            f"{(peak - idle) / size:.2f}x",
            "",
        ]
    )
    for stage, value in stages.items():
        above = value - idle
        rows.append([f"    peak above idle, {stage}", f"{above / 2**20:.0f} MB", "", f"{above / size:.2f}x", ""])
    print(f"result: {size / 2**20:.1f} MB of JSON, {count} records\n")
    print(table(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=60)
    anyio.run(main, parser.parse_args().mb)
