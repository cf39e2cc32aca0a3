"""`python -m evora_services.cli ...`: the `evora` command without its console script."""

from evora_services.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
