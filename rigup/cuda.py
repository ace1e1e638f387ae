"""The CUDA toolkit's apt packages, by where they come from (``cuda_source``): roles/cuda_toolkit
installs them, and roles/llama_cpp's compile on a host that was to receive its build (the build
refused) needs the compiler as well."""

# what ggml-cuda loads at run time (the CUDA runtime, cuBLAS and cuBLASLt; libcuda is the driver's),
# for a host that receives its build: NVIDIA's repository ({v}: 12-8), and each distribution's own
# nvidia-cuda-toolkit's library packages (a distribution not listed gets the whole toolkit)
RUNTIME = {"nvidia": ["cuda-cudart-{v}", "libcublas-{v}"],
           ("debian", 12): ["libcudart11.0", "libcublas11", "libcublaslt11"],
           ("ubuntu", 22): ["libcudart11.0", "libcublas11", "libcublaslt11"],
           ("ubuntu", 24): ["libcudart12", "libcublas12", "libcublaslt12"]}


def toolkit_packages(source: str, version: str) -> list[str]:
    """The whole toolkit, compiler included (none for ``present``: it is there, or refused)."""
    return {"nvidia": [f"cuda-toolkit-{version.replace('.', '-')}"], "distro": ["nvidia-cuda-toolkit"]}.get(source, [])


def runtime_packages(source: str, version: str, distro: tuple[str, int]) -> list[str] | None:
    """The run-time libraries alone for ``distro`` (ID, major), or None where unknown."""
    if source == "nvidia":
        return [p.format(v=version.replace(".", "-")) for p in RUNTIME["nvidia"]]
    return RUNTIME.get(distro)
