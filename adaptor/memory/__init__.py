"""Memory mechanisms: what the features in patches/memory use to keep device memory down."""
