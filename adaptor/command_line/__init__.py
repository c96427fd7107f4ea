"""Command-line tables: what each Megatron flag does here, and MindSpeed-LLM's spellings.

Plain data and functions, importable without patching anything."""
