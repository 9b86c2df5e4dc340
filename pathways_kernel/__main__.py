"""``python -m pathways_kernel -f CONNECTION_FILE`` runs the kernel;
``python -m pathways_kernel install [...]`` installs a kernelspec."""

import sys

if len(sys.argv) > 1 and sys.argv[1] == "install":
    from pathways_kernel.kernelspec import main as install_main

    sys.exit(install_main(sys.argv[2:]))
else:
    # The default backend's server starts now, beside this process's own imports (ipykernel, JAX).
    from pathways_kernel.backends import start_server_early

    start_server_early()
    from pathways_kernel.kernel import main

    main()
