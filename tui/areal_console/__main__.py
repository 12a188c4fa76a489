from areal_console.cli import main

raise SystemExit(main())
