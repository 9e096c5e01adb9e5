from gateway.launch import main

if __name__ == "__main__":  # not when a worker process started with `spawn` imports the main module
    raise SystemExit(main())
