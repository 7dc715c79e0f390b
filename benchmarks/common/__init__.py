"""What several benchmarks share: the server harness, the payload and throwaway databases."""
