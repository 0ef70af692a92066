"""polyfuse_torch's Python side without torch or a GPU: how a call's
inputs (positional, by name) and outputs (returned, or given with out=)
reach the extension, and the errors for wrong calls. The extension is
replaced by a fake that records what it is given. Run by
scripts/abi-test.sh (python3 examples/torch/test_polyfuse_torch.py).
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import polyfuse_torch  # noqa: E402


class FakeCompiled:
    """What the C++ extension's Compiled offers, recording its calls."""

    def __init__(self, program, params, arch, torch_workspace):
        self.program, self.params = program, params
        self.arch, self.torch_workspace = arch, torch_workspace
        self.calls = []
        self.workspace_bytes, self.num_temps, self.num_temps_in_memory = 512, 3, 1
        self.num_kernels = 2

    def specs(self):
        # Argument order: A (input), C (output), B (input).
        return [
            {"name": "A", "role": "input", "dtype": "f16", "shape": [4, 8]},
            {"name": "C", "role": "output", "dtype": "f32", "shape": [4, 2]},
            {"name": "B", "role": "input", "dtype": "f16", "shape": [8, 2]},
        ]

    def run(self, inputs, outputs):
        self.calls.append((list(inputs), list(outputs)))
        return outputs or ["new C"]

    def cuda_source(self):
        return "__global__"


class FakeExtension:
    Compiled = FakeCompiled


class CallTest(unittest.TestCase):
    def setUp(self):
        polyfuse_torch._ext = FakeExtension()
        self.f = polyfuse_torch.compile("gemm.json", M=4, K=8, N=2)

    def test_sizes_and_options_reach_the_extension(self):
        self.assertEqual(self.f._c.params, [("K", 8), ("M", 4), ("N", 2)])
        self.assertEqual(self.f._c.arch, "")
        g = polyfuse_torch.compile({"name": "p"}, arch="sm_90", torch_workspace=True)
        self.assertEqual(g._c.program, '{"name": "p"}')
        self.assertEqual((g._c.arch, g._c.torch_workspace), ("sm_90", True))
        self.assertEqual([s["name"] for s in self.f.inputs], ["A", "B"])
        self.assertEqual([s["name"] for s in self.f.outputs], ["C"])
        self.assertEqual(self.f.workspace_bytes, 512)

    def test_inputs_positionally_or_by_name(self):
        self.assertEqual(self.f("a", "b"), "new C")
        self.assertEqual(self.f(B="b", A="a"), "new C")
        self.assertEqual(self.f("a", B="b"), "new C")
        self.assertEqual(self.f._c.calls, [(["a", "b"], [])] * 3)

    def test_outputs_given(self):
        self.assertEqual(self.f("a", "b", out="c"), "c")
        self.assertEqual(self.f("a", "b", out=("c",)), "c")
        self.assertEqual(self.f._c.calls[-1], (["a", "b"], ["c"]))

    def test_wrong_calls_say_what_is_wrong(self):
        for call, message in [
            (lambda: self.f("a"), "missing inputs: B"),
            (lambda: self.f("a", "b", "x"), "takes 2 inputs"),
            (lambda: self.f("a", Q="q"), "no input named Q"),
            (lambda: self.f("a", "b", A="a"), "input A given twice"),
        ]:
            with self.assertRaises(TypeError) as e:
                call()
            self.assertIn(message, str(e.exception))
        self.assertEqual(self.f._c.calls, [])


if __name__ == "__main__":
    unittest.main()
