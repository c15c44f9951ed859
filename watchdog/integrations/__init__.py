"""Drop-in integrations with agent frameworks (each imported only when used).

- `watchdog.integrations.langchain`: a LangChain callback handler (extra `langchain`).
- `watchdog.integrations.openai_agents`: OpenAI Agents SDK run hooks (extra `openai-agents`).
"""
