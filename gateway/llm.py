"""OpenAI-compatible endpoint client (LM Studio, Ollama, llama.cpp, vLLM)."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx2

from gateway.settings import LLMSettings

log = logging.getLogger("gateway.llm")


class LLMClient:
    def __init__(self, settings: LLMSettings, workspace: Path):
        self.settings = settings
        self.workspace = workspace
        self._http: httpx2.AsyncClient | None = None

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
