"""Mixed memory sessions for compaction: facts of the kinds people write down, among filler.

Each session is a list of notes; a fact note carries the query a user would recall it by (its identifier
as written, or a word of a Korean sentence) and its fact line, which recall must return verbatim after
compaction. `TUNING` is what the fallback and recall were shaped on; `HELD_OUT` is written differently
(other labels and filler, other identifier shapes, facts spread over lines, Korean with particles) and
is only measured, never tuned on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Note:
    text: str
    query: str = ""  # "" = filler
    line: str = ""  # the fact line recall must return verbatim (the whole text when empty)

    @property
    def fact(self) -> str:
        return self.line or self.text


_TUNING_FACTS = [
    Note(
        "src/app.ts:42 assumes the session cookie is already set; the check must move before the redirect",
        "src/app.ts:42",
    ),
    Note("TICKET-88 is owned by Dana Kim and is due 2026-12-04", "TICKET-88"),
    Note("The staging address changed from 192.168.3.12 to 192.168.3.17 on 2026-11-28", "192.168.3.17"),
    Note("Error E7310 means the upload token expired; the client must refresh it", "E7310"),
    Note("Pinned pydantic to v2.9.2 because v2.10 breaks the settings loader", "v2.9.2"),
    Note("결제 모듈의 타임아웃은 30초로 늘렸고 담당자는 김민수 님이다", "타임아웃"),
    Note("The cache key prefix is cfg:v3:tenant and lives in config/cache.yaml", "cfg:v3:tenant"),
    Note("Commit 0x5be0c1 reverted the retry change in lib/retry.py", "0x5be0c1"),
    Note("Max upload size is 25 MB, set by client_max_body_size in nginx", "client_max_body_size"),
    Note("Build 4471 is the last green build on main", "4471"),
    Note("정산 배치는 매일 새벽 03:30에 실행된다", "정산 배치"),
    Note("Dana said the API quota is 1,200 requests per minute per tenant", "1,200"),
]
_TUNING_FILLER = [
    "routine progress on the layout, nothing blocking",
    "routine progress on the layout, still nothing blocking",
    "more routine progress on the layout today",
    "routine work, nothing blocking",
    "progress on the layout continues, nothing new",
    "nothing blocking, routine progress",
    "routine progress on the layout, nothing to report",
    "the layout work goes on, nothing blocking",
    "routine progress, nothing blocking on the layout",
    "still routine progress on the layout",
    "nothing blocking; layout progress is routine",
    "routine progress on the layout again",
]


def _mix(facts: list[Note], filler: list[str], label: str) -> list[Note]:
    """Facts and filler alternating, filler numbered the way people number their notes."""
    out: list[Note] = []
    for i in range(max(len(facts), len(filler))):
        if i < len(filler):
            out.append(Note(label.format(n=len(out) + 1, text=filler[i])))
        if i < len(facts):
            out.append(facts[i])
    return out


TUNING = _mix(_TUNING_FACTS, _TUNING_FILLER, "note {n}: {text}")

_HELD_OUT_FACTS = [
    Note(
        "Root cause found.\nworker/queue.go:118 drops the message when the retry count hits zero.\nWill fix after lunch.",
        "worker/queue.go:118",
        "worker/queue.go:118 drops the message when the retry count hits zero.",
    ),
    Note("Ops handed INC-5521 to Priya; she reports back on Thursday", "INC-5521"),
    Note("DNS for api.internal now points at 10.20.0.45 (was 10.20.0.9) since the move", "10.20.0.45"),
    Note("exit status 137 from the importer = it was OOM-killed, give it 2Gi", "exit status 137"),
    Note("Locked node to 22.11.0 in .nvmrc; 23.x breaks the sqlite binding", "22.11.0"),
    Note("검색 API 응답이 느린 원인은 인덱스 누락이었고, 박지훈 님이 고치기로 했다", "인덱스 누락"),
    Note(
        "Feature flag checkout.new_flow stays off in prod until the 12th\n(marketing wants it with the campaign)",
        "checkout.new_flow",
        "Feature flag checkout.new_flow stays off in prod until the 12th",
    ),
    Note("Hash of the bad release: sha256 9f2c41aa07; roll back to tag rel-2026.11.3", "rel-2026.11.3"),
    Note("Keep PG max_connections at 300 — the pooler assumes it", "max_connections"),
    Note("Customer #30412 sees double charges only on iOS 18.1", "#30412"),
    Note("백업 보존 기간은 35일로 정했고, 버킷은 s3://acme-backups/prod 이다", "s3://acme-backups/prod"),
    Note("Latency budget for /search is p95 < 180 ms per the SLO doc", "p95"),
]
_HELD_OUT_FILLER = [
    "Standup. Same as yesterday, moving along with the sidebar styles.",
    "Went over the sidebar styles again with the designer, looks fine.",
    "Quiet morning. Reviewed a couple of small pull requests.",
    "Paired on the sidebar for a while, no surprises.",
    "Mostly meetings today, little hands-on work.",
    "Tidied up the sidebar styles, nothing worth noting.",
    "오늘은 사이드바 스타일 작업을 계속했다, 특별한 일은 없었다",
    "Reviewed pull requests, answered a few questions in chat.",
    "Sidebar styles nearly done; the usual back and forth.",
    "회의가 많아서 작업은 조금밖에 못 했다",
    "Caught up on email and the team channel.",
    "Sidebar polish, small things only.",
]

HELD_OUT = _mix(_HELD_OUT_FACTS, _HELD_OUT_FILLER, "Day {n} - {text}")
