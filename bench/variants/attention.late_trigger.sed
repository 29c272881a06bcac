# attention_decode lets the next kernel launch after its wait, not at entry
/^    pdl_launch_dependents();$/d
s/^    pdl_wait();$/    pdl_wait();\n    pdl_launch_dependents();/
