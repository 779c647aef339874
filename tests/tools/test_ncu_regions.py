#!/usr/bin/env python3
"""bench/ncu_regions.py on small synthetic ncu source exports: the step's regions, the samples
inside and outside the loop, the stall reasons, and the errors for exports it cannot split."""
import csv
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "bench", "ncu_regions.py")
HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)",
          "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed", "stall_barrier",
          "stall_wait", "stall_barrier (Not Issued)", "stall_wait (Not Issued)"]

# (source, executions, barrier samples, wait samples); a step runs 8 times, the prologue once.
STEP = [
    ("S2R R0, SR_TID.X", 1, 0, 3),
    ("BAR.SYNC.DEFER_BLOCKING R14, 0x80", 8, 5, 0),  # loop top
    ("HGMMA.64x64x16.F32.BF16 R184, gdesc[UR20], RZ, !UPT", 8, 0, 2),  # first S wgmma
    ("HGMMA.64x64x16.F32.BF16 R152, gdesc[UR20], RZ, !UPT", 8, 0, 1),
    ("IMAD.WIDE.U32 R10, R11, -0x2daee0ad, RZ", 8, 0, 7),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x1", 8, 11, 0),  # wait for S
    ("MUFU.EX2 R12, R12", 8, 0, 4),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 8, 13, 0),  # wait for dP
    ("FADD R1, R2, R3", 8, 0, 1),
    ("HGMMA.64x128x16.F32.BF16 R24, R196, gdesc[UR4].tnspB, R24", 8, 0, 2),  # first dV
    ("STS [R5], R6", 8, 0, 1),
    ("BAR.SYNC.DEFER_BLOCKING 0x1, 0x100", 8, 17, 0),  # dS barrier
    ("HGMMA.64x64x16.F32.BF16 R152, gdesc[UR20].tnspA.tnspB, RZ, !UPT", 8, 0, 1),  # dQ
    ("WARPGROUP.DEPBAR.LE gsb0, 0x1", 8, 19, 0),  # wait for dQ
    ("REDG.E.ADD.F32x4.FTZ.RN.STRONG.GPU desc[UR30][R16.64], R160", 8, 0, 6),
    ("@!P0 BRA 0x7f0", 8, 0, 1),  # loop end
    ("EXIT", 1, 0, 2),
]


def write_export(path, rows, header=HEADER):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["Kernel Name", "void attention_backward_kernel<...>(BackwardTmaParams)"])
        w.writerow(header)
        for k, (src, execs, barrier, wait) in enumerate(rows):
            w.writerow([hex(0x7f00 + 16 * k), src, barrier + wait, barrier + wait, execs, barrier,
                        wait, barrier, wait])


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


class NcuRegions(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def path(self, name):
        return os.path.join(self.dir.name, name)

    def test_splits_the_step_at_its_landmarks(self):
        write_export(self.path("a.csv"), STEP)
        proc = run(self.path("a.csv"), "--json", self.path("a.json"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(self.path("a.json")) as f:
            res = json.load(f)[0]
        got = {r["region"]: (r["samples"], r["instructions"]) for r in res["regions"]}
        self.assertEqual(got, {"loop top": (5, 1), "S, dP issue": (10, 3), "wait S, P": (15, 2),
                               "wait dP, dS": (14, 2), "dV, dS store": (20, 3),
                               "dQ, dK issue": (20, 2), "dQ out, end": (7, 2)})
        self.assertEqual(res["executions_per_instruction"], "8")
        self.assertEqual((res["total_samples"], res["loop_samples"], res["outside_loop"]),
                         (96, 91, 5))
        top = {r["region"]: r["top_reasons"][0] for r in res["regions"]}
        self.assertEqual(top["S, dP issue"], ["wait", 10])
        self.assertEqual(top["dQ, dK issue"], ["barrier", 19])
        self.assertIn("91 in the consumer loop", proc.stdout)

    def test_a_missing_landmark_is_named(self):
        rows = [r for r in STEP if "0x0" not in r[0] or "DEPBAR" not in r[0]]
        write_export(self.path("b.csv"), rows)
        proc = run(self.path("b.csv"))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("wait for dPᵀ", proc.stderr)

    def test_an_export_without_stall_samples_is_refused(self):
        header = [h if h != "Warp Stall Sampling (All Samples)" else "Other" for h in HEADER]
        write_export(self.path("c.csv"), STEP, header)
        proc = run(self.path("c.csv"))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("Warp Stall Sampling (All Samples)", proc.stderr)


if __name__ == "__main__":
    unittest.main()
