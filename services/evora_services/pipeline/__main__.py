"""Entry point for spark-submit, which takes a Python file rather than a console script:

    spark-submit --master spark://host:7077 --jars /usr/share/java/postgresql.jar \\
        "$(python -c 'import evora_services.pipeline.__main__ as m; print(m.__file__)')" run

Same arguments as `evora pipeline`; `python -m evora_services.pipeline ...` works too.
"""

import sys

from evora_services.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["pipeline", *sys.argv[1:]]))
