"""The command line: other projects' spellings, backend defaults, early one-line checks, the
policy for every Megatron flag, and launching without torchrun."""
