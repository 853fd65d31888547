import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs a worker per core: torch's OpenMP pool of one thread per core in every
    # worker would oversubscribe the cores, and its spinning threads then run the in-process
    # training tests many times slower (17 s -> 220 s for one, measured with other runs beside it);
    # commands a test starts pass their own threads
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
