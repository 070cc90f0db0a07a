from p2psync.cli import main

raise SystemExit(main())
