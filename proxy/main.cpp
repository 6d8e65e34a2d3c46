#include "proxy/server.h"

int main(int argc, char** argv) { return fencegate::proxy::run_cli(argc, argv); }
