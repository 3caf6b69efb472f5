"""liger_jax inside other libraries' models and trainers. Each integration imports its library only when used."""
