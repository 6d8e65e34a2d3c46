// Compiles the history checker into test_fault. tests/CMakeLists.txt builds test_fault from
// tests/fault/*_test.cpp only, so history.cpp is included here, once; every other file includes
// history.h. (If the build ever compiles tests/fault/*.cpp itself, delete this file.)
#include "tests/fault/history.cpp"
