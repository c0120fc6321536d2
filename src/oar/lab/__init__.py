"""The arithmetic lab: a CPU testbed where token-level credit assignment can be measured."""
