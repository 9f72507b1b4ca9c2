"""loomrt: an agent runtime whose agents work for hours without outgrowing the context
window, and without forgetting.

    from loomrt import Runtime, load_agents

    agents = load_agents("agents.yaml")
    result = Runtime().run_sync("assistant", "What is 2 + 2?", agents=agents)
    print(result.output)
"""

from loomrt.activity import Activity, AnswerText
from loomrt.errors import (
    LoomError,
    NotFoundError,
    ProviderError,
    RunError,
    ScriptExhaustedError,
    SpecError,
    StateError,
    StoreError,
)
from loomrt.events import Event, RunInfo
from loomrt.messages import EvictedSpan, Message, ToolCall
from loomrt.record import SQLiteStore, Store
from loomrt.run.state import RunResult, RunState
from loomrt.runtime import Runtime
from loomrt.spec import AgentsFile, AgentSpec, ContextSpec, agents_json_schema
from loomrt.spec_load import load_agents, load_agents_text
from loomrt.tools import Tool, tool
from loomrt.toolset import Toolset, resolve_toolset

__version__ = "0.1.0"

__all__ = [
    "Activity",
    "AgentSpec",
    "AgentsFile",
    "AnswerText",
    "ContextSpec",
    "Event",
    "EvictedSpan",
    "LoomError",
    "Message",
    "NotFoundError",
    "ProviderError",
    "RunError",
    "RunInfo",
    "RunResult",
    "RunState",
    "Runtime",
    "SQLiteStore",
    "ScriptExhaustedError",
    "SpecError",
    "StateError",
    "Store",
    "StoreError",
    "Tool",
    "ToolCall",
    "Toolset",
    "agents_json_schema",
    "load_agents",
    "load_agents_text",
    "resolve_toolset",
    "tool",
    "__version__",
]
