"""One module per op: the pure-JAX reference, the kernel launches, the custom_vjp and the argument checks."""
