"""Tools an agent calls inside a task's sandbox (observations are plain text for the model)."""

from patchgym.gym_envs.tools.editor import StrReplaceEditor, ToolError

__all__ = ["StrReplaceEditor", "ToolError"]
