"""The llama.cpp build a hardware plan asks for (pure: no host)."""
from rigup.config import group_vars
from rigup.gpu.plan import hardware_plan as _plan
from roles.llama_cpp import build_id, cmake_options, render_build_script


def _gpu(cc, pci):
    return {"index": 0, "uuid": "GPU-x", "bus_id": "00000000:07:00.0", "pci_device_id": pci,
            "name": "x", "compute_capability": cc, "memory_total_mib": 81920}


def test_cuda_build_names_the_archs_never_native():
    data = {**group_vars("all"), "llama_cpp_backend": "auto", "gpu_enabled": True}
    driver = {"version": "580.105.08", "loaded": True, "kernel_module": "open"}
    for cc, pci, arch in (((8, 0), "10de:20b2", "80"), ((9, 0), "10de:2330", "90")):
        options = cmake_options(_plan([_gpu(cc, pci)], driver, []), data)
        assert "GGML_CUDA=ON" in options and f"CMAKE_CUDA_ARCHITECTURES={arch}" in options
        script = render_build_script(data, options)
        assert f"-DCMAKE_CUDA_ARCHITECTURES={arch}" in script and "native" not in script
    mixed = _plan([_gpu((8, 0), "10de:20b2"), {**_gpu((9, 0), "10de:2330"), "index": 1}], driver, [])
    assert "CMAKE_CUDA_ARCHITECTURES=80;90" in cmake_options(mixed, data)


def test_build_id_changes_with_ref_and_options_only():
    data = group_vars("all")
    a = build_id(data, ["X=1"])
    assert a == build_id(data, ["X=1"])
    assert a != build_id(data, ["X=2"])
    assert build_id({**data, "llama_cpp_ref": "b9000"}, ["X=1"]).startswith("b9000-")


def test_ccache_off_is_off_for_llama_cpps_own_cmake_too():
    """llama.cpp's CMake uses a ccache it finds by itself (GGML_CCACHE on by default): with
    llama_cpp_ccache false, the build says no to it as well (make bench-handover measured a
    "ccache off" cold build of 12 s before)."""
    data = {**group_vars("all"), "llama_cpp_backend": "cpu"}
    plan = _plan([], {"loaded": False}, [])
    on, off = cmake_options(plan, data), cmake_options(plan, {**data, "llama_cpp_ccache": False})
    assert "CMAKE_CXX_COMPILER_LAUNCHER=ccache" in on and "GGML_CCACHE=OFF" not in on
    assert "GGML_CCACHE=OFF" in off and not any("LAUNCHER" in o for o in off)


def test_a_receiving_host_that_compiles_after_all_installs_the_cuda_compiler_too():
    """roles/cuda_toolkit gives a receiving host the run-time libraries alone; its fallback compile
    (the build refused, or never packed) installs the toolkit with the build tools."""
    from roles.llama_cpp import fallback_packages
    from rigup.cuda import runtime_packages, toolkit_packages

    driver = {"version": "580.105.08", "loaded": True, "kernel_module": "open"}
    gpu = _plan([_gpu((8, 0), "10de:20b2")], driver, [])
    data = {**group_vars("all"), "llama_cpp_backend": "auto", "gpu_enabled": True, "cuda_source": "distro"}
    assert "nvidia-cuda-toolkit" in fallback_packages(gpu, data) and "cmake" in fallback_packages(gpu, data)
    assert "cuda-toolkit-12-8" in fallback_packages(gpu, {**data, "cuda_source": "nvidia", "cuda_version": "12.8"})
    cpu = fallback_packages(_plan([], {"loaded": False}, []), {**data, "llama_cpp_backend": "cpu"})
    assert "cmake" in cpu and not any("cuda" in p for p in cpu)
    assert runtime_packages("nvidia", "12.8", ()) == ["cuda-cudart-12-8", "libcublas-12-8"]
    assert runtime_packages("distro", "12.8", ("debian", 12)) == ["libcudart11.0", "libcublas11", "libcublaslt11"]
    assert runtime_packages("distro", "12.8", ("fedora", 40)) is None and toolkit_packages("present", "12.8") == []


def test_a_refused_received_build_kept_aside_is_no_build(tmp_path):
    """A received build that failed its smoke is moved to builds/<id>.refused: the builds' fact
    (run here with bash, as on a host) does not count it, so the next converge compiles <id>."""
    import json
    import subprocess

    from roles.llama_cpp.facts import LlamaCppState, parse_state

    for name, ident in (("a-1", "a-1"), ("b-2.refused", "b-2")):
        (tmp_path / "builds" / name).mkdir(parents=True)
        (tmp_path / "builds" / name / "rigup-build.json").write_text(json.dumps({"id": ident}))
        (tmp_path / "builds" / name / "rigup-smoke.json").write_text(json.dumps({"ok": name == "a-1"}))
    out = subprocess.run(["bash", "-c", LlamaCppState().command(str(tmp_path))], capture_output=True, text=True)
    state = parse_state(out.stdout.splitlines())
    assert list(state["builds"]) == ["a-1"] and list(state["smokes"]) == ["a-1"], state


def test_a_switch_mark_names_a_build_as_rigup_writes_it_or_none():
    """Round 35: the mark of a switch cut short was any text the host printed (shown escaped in the plan); it is
    builds/<id> as switched writes it, else a mark of no build rigup names (the plan still says a switch was cut
    short, and the next switch removes the mark)."""
    from roles.llama_cpp.facts import parse_state
    assert parse_state(["switching=builds/b12-abc"])["switching"] == "builds/b12-abc"
    assert parse_state(["switching=builds/../../etc \x1b[2J"])["switching"] == "a build its mark does not name"
    assert parse_state(["switching="])["switching"] is None and parse_state([])["switching"] is None
