// ESLint for the extension's TypeScript: the recommended and type-aware rule
// sets of typescript-eslint, with formatting left to Prettier.
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  {
    ignores: [
      'labextension/lib/**',
      'labextension/build-test/**',
      'pathways_kernel/labextension/**',
      'node_modules/**',
      '.venv/**'
    ]
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['labextension/**/*.ts'],
    rules: {
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
      eqeqeq: ['error', 'smart'],
      curly: ['error', 'all']
    }
  },
  prettier
);
