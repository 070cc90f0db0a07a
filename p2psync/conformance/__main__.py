from p2psync.conformance.cli import main

raise SystemExit(main())
