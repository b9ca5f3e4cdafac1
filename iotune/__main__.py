from iotune.cli import main

main()
