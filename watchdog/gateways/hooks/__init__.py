"""`agent-watchdog hook`: a coding CLI's command hooks (Claude Code, Codex CLI, Gemini CLI) as a witness."""
