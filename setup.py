"""Build hook: generate the search service's gRPC modules from serving/search.proto.

Everything else about the package lives in pyproject.toml. The generated files
(serving/search_pb2.py, serving/search_pb2_grpc.py) are written into the source tree so that
editable and regular installs both have them; git ignores them.
"""

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def generate_search_protos() -> None:
    """Run grpc_tools.protoc on serving/search.proto as the module tfhash.serving.search_pb2."""
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"--proto_path=tfhash/serving={os.path.join(HERE, 'serving')}",
             f"--python_out={out}", f"--grpc_python_out={out}", "tfhash/serving/search.proto"],
            check=True,
        )  # fmt: skip
        for name in ("search_pb2.py", "search_pb2_grpc.py"):
            os.replace(os.path.join(out, "tfhash", "serving", name), os.path.join(HERE, "serving", name))


class BuildPyWithProtos(build_py):
    def run(self):
        generate_search_protos()
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
