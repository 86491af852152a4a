"""emunum.kernels: Numba rounding kernels. Nothing is compiled at import; CUDA is imported only on use."""
