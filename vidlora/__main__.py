from vidlora.cli import main

main()
