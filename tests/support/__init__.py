"""What tests share: builders, local servers that speak real protocols, the worker harness."""
