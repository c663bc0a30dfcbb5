"""The modules of ``benchmarks/speed.py`` (and of ``anchors.py``), none of them run on its own:

* ``workloads``: the models, their data, the per-client loop, one backend timed, the dense rate;
* ``sections``: the measuring sections (every one but the ceiling and Karula's);
* ``ceiling``: the matmul ceiling section;
* ``roofline``: the least time a round can take on a device (FLOPs / dense rate, bytes / copy
  bandwidth) and the achieved share;
* ``trace``: device traces summarised (kernels, copies, how busy the device was);
* ``gpu``: ``speed.py --preset gpu``, the GPU points in one call;
* ``report``: the markdown, the acceptance checks and the writing of the results.

The scripts put ``benchmarks/`` on ``sys.path`` (they run from there), so these import as
``speedlib.<module>``.
"""
